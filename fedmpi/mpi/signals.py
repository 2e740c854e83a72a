"""Stop requests: SIGTERM or SIGUSR1 on any rank asks the whole job to stop at the next round boundary.

SLURM sends SIGTERM at a time limit or preemption (and any signal chosen with `--signal=USR1@120`
some time before); mpiexec (hydra) forwards SIGTERM and SIGUSR1 to every rank; `kill` may reach only
one rank. The handler only records the request: the flag rides to rank 0 in the round's reduction
(`experiment.STOP`), rank 0 answers with `CMD_STOP` in the next broadcast header, and then every rank
takes part in writing a checkpoint and exits with 75 (`errors.EXIT_PREEMPTED`), so a batch script can
requeue itself. Rounds are never cut in the middle: a checkpoint is a round boundary.

SIGINT (Ctrl-C, which mpiexec forwards to every rank, or a signal to one rank) interrupts at once: the first
one raises KeyboardInterrupt, later ones are ignored so that the clean-up (status `interrupted`, one line,
exit 130) is not itself interrupted into a traceback. A worker inside a collective raises it when the
collective ends (`interrupt_after`).

Before any of that, from the entry point's first line (`install_early`, before torch is imported: a
Ctrl-C in the first seconds used to print a 50-line traceback from inside torch's import and die by SIGINT):
SIGINT raises one KeyboardInterrupt, which `fedmpi.cli.main` turns into the line `fedmpi: interrupted`
and exit 130 (a second Ctrl-C exits 130 at once, except in a rank of several, which ends its job through
MPI whatever happens: see `_early_interrupt`); SIGTERM prints one line and exits 143; SIGPIPE is
ignored (a closed pipe is an error on the write, which `fedmpi.core.console` absorbs, not a silent death); a
closed stdin/stdout/stderr is reopened on /dev/null, so no file the run opens lands on descriptor 2.

Ctrl-C must never be swallowed: Python runs a signal handler wherever the interpreter is, including inside
a weakref callback (h5py's object registry runs one each time an HDF5 object is freed), where the
KeyboardInterrupt is printed as "Exception ignored" and dropped (and later SIGINTs are ignored): the run
went on to exit 0 `finished`. `held` holds SIGINT back around such code (the run log's writes) and
raises its KeyboardInterrupt after the block, in ordinary code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from fedmpi.core.errors import StopRequested
from fedmpi.mpi import launcher

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received = []
_interrupts = []        # one entry per SIGINT that raised a KeyboardInterrupt (see `held`)
EXIT_TERMINATED = 128 + signal.SIGTERM     # 143, what a shell reports for a process killed by SIGTERM


def _handler(signum, frame):
    _received.append(signal.Signals(signum).name)


def _interrupt(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _interrupts.append(signum)
    raise KeyboardInterrupt


def _early_interrupt(signum, frame):
    """The first Ctrl-C before the run's handlers: one KeyboardInterrupt (cli.main prints the line); a second
    one, e.g. while a swallowed first one left the process running, ends it at once. Not so for a rank of
    several: mpiexec forwards the terminal's Ctrl-C to every rank, which the terminal reached already, so a
    second one is the rule there, and it must not cut short the first one's ending of the job (an exit
    before MPI_Init would leave the other ranks waiting inside theirs: fedmpi.mpi.launcher)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN if launcher.one_of_several() else _interrupt_now)
    _interrupts.append(signum)
    if _inside_import(frame):
        # Raised here it could surface inside a C++ callback of torch's import (pybind11), which then calls
        # std::terminate: the rank aborts instead of ending with one line. Raised at the next set-up step
        # instead (`raise_deferred`), a moment later.
        _deferred.append(signum)
        return
    raise KeyboardInterrupt


_deferred = []          # an early Ctrl-C that came during an import, raised by `raise_deferred`


def _inside_import(frame):
    """Whether `frame` runs inside an import of torch (whose C++ extensions call back into Python)."""
    importing = torch_code = False
    while frame is not None:
        name = frame.f_code.co_filename
        importing = importing or name.startswith("<frozen importlib")
        torch_code = torch_code or f"{os.sep}torch{os.sep}" in name
        frame = frame.f_back
    return importing and torch_code


def raise_deferred():
    """Set-up, after each step that imports heavy modules: the KeyboardInterrupt of a Ctrl-C that came while
    they were being imported (`_early_interrupt`)."""
    if _deferred:
        _deferred.clear()
        raise KeyboardInterrupt


def _interrupt_now(signum, frame):
    _last_words("fedmpi: interrupted\n", 130)


def _early_terminate(signum, frame):
    _last_words("fedmpi: terminated (SIGTERM)\n", EXIT_TERMINATED)


def _last_words(text, code):
    """One line straight to descriptor 2 and exit: nothing to clean up yet (no run log, no MPI job), and
    nothing that could raise or wait (a print could meet a broken pipe; atexit handlers could block)."""
    try:
        os.write(2, text.encode())
    except OSError:
        pass
    os._exit(code)


def install_early():
    """The entry point's first step (main thread, before anything heavy is imported): see the module
    docstring. `install` replaces the SIGINT/SIGTERM handlers once a run has something to clean up. Returns
    the previous handlers, for `restore_early`; does nothing outside the main thread (signal.signal would
    raise there)."""
    _open_missing_std_fds()
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, _early_interrupt),
                signal.SIGTERM: signal.signal(signal.SIGTERM, _early_terminate)}
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    return previous


def restore_early(previous):
    """Puts back the handlers `install_early` replaced where they are still the early ones (a run's own
    handlers, or the ignored signals of a finished run, stay: see `ignore_all`)."""
    for sig, handler in previous.items():
        if signal.getsignal(sig) in (_early_interrupt, _interrupt_now, _early_terminate) and handler is not None:
            signal.signal(sig, handler)


def _open_missing_std_fds():
    """A descriptor 0/1/2 closed by the caller (`2>&-`) is reopened on /dev/null, and Python's None streams
    for it replaced: the progress output then goes nowhere instead of failing with an AttributeError (or a
    print(file=None) landing on stdout), and the first file the run opens cannot become its stderr."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            try:
                got = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
                if got != fd:
                    os.dup2(got, fd)
                    os.close(got)
            except OSError:
                continue
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


# Where `test_pause` may pause, in the order a run passes them: set-up (the entry point; before the config is
# read; before and after MPI_Init; set-up's collectives among the node's ranks; the data; the partition; the
# model; the first round's broadcast), then the final model write.
SETUP_PAUSES = ("start", "import", "mpi_init", "claim", "node_local", "data", "partition", "model",
                "round_buffers", "broadcast")
PAUSE_POINTS = SETUP_PAUSES + ("ticket_counter", "model_write")     # (dealt clients only: not in a small run)
_paused = set()


def test_pause(where):
    """Test aid: FEDMPI_TEST_SLEEP_AT=WHERE (one of PAUSE_POINTS) pauses here, the first time a process comes
    by, for FEDMPI_TEST_SLEEP_S seconds (default 5) after writing `fedmpi-test: paused at WHERE` to stderr, so
    that a test can send a signal at that moment instead of guessing when it comes. FEDMPI_TEST_SLEEP_RANK=R
    pauses only the rank its launcher numbered R; the others write `fedmpi-test: passed WHERE` and run on,
    into whatever waits for rank R. FEDMPI_TEST_SLEEP_UNTIL=PATH ends the pause as soon as PATH exists (the
    seconds then only bound it), so that a test can hold a run at that point for exactly as long as it needs.
    `model_write` sleeps inside a weakref callback, where the interpreter swallows exceptions, as it does
    inside h5py's object registry."""
    if where not in PAUSE_POINTS:
        raise ValueError(f"test_pause({where!r}): not one of signals.PAUSE_POINTS")
    if os.environ.get("FEDMPI_TEST_SLEEP_AT") != where or where in _paused:
        return
    _paused.add(where)
    rank = os.environ.get("FEDMPI_TEST_SLEEP_RANK", "").strip()
    if rank and str(launcher.launcher_rank()) != rank:
        _test_line(f"fedmpi-test: passed {where}")     # into what comes next (what waits for rank R)
        return
    seconds = float(os.environ.get("FEDMPI_TEST_SLEEP_S", "5"))
    _test_line(f"fedmpi-test: paused at {where}")
    if where != "model_write":
        # In slices: a signal the kernel hands to one of torch's or MPI's threads does not cut a long sleep of
        # the main thread short, and Python runs the handler only once the main thread is back in bytecode.
        end, until = time.monotonic() + seconds, os.environ.get("FEDMPI_TEST_SLEEP_UNTIL")
        while time.monotonic() < end and not (until and os.path.exists(until)):
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return
    import weakref

    class _Probe:
        pass

    probe = _Probe()
    ref = weakref.ref(probe, lambda _: time.sleep(seconds))     # the callback runs when `probe` goes
    del probe, ref


def _test_line(text):
    try:
        os.write(2, f"{text}\n".encode())
    except OSError:
        pass


def install():
    """Turns SIGTERM/SIGUSR1 into stop requests and SIGINT into one KeyboardInterrupt for this process
    (call from the main thread)."""
    raise_deferred()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)
    signal.signal(signal.SIGINT, _interrupt)


# Inside `keep_handlers`: this process runs one experiment after another; each entry is how a stopped
# experiment is continued (None: as any run, with --resume).
_sweeping = []


@contextlib.contextmanager
def keep_handlers(continue_with=None):
    """A sweep (fedmpi.sweep) runs experiment after experiment in this process: inside this block `ignore_all`,
    which each experiment calls when it ends, leaves the handlers in place, so that a SIGTERM between two
    experiments still stops the sweep (its work is not done). `continue_with`: what the stop line of an
    experiment stopped here tells the user to do (a sweep has no --resume: the same spec again continues it)."""
    _sweeping.append(continue_with)
    try:
        yield
    finally:
        _sweeping.pop()


def ignore_all():
    """The job's work is done: further signals change nothing. (Python resets the handlers it installed to
    the default at exit, before MPI finalizes; an ignored signal stays ignored, so a late SIGTERM cannot kill
    a finished rank with status 15.) Not inside a sweep (`keep_handlers`)."""
    if _sweeping:
        return
    for sig in STOP_SIGNALS + (signal.SIGINT,):
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def interrupt_after():
    """Holds a SIGINT back until the block ends, then raises the KeyboardInterrupt: for a worker inside a
    collective (fedmpi.mpi.comm). A worker that left a barrier rank 0 had already passed would leave rank 0
    blocked in the collective that follows, where it cannot hear of the failure. Python runs signal
    handlers in the main thread whichever thread the signal reached, so swapping the handler suffices."""
    if signal.getsignal(signal.SIGINT) is not _interrupt:      # ignored already (the work is done)
        yield
        return
    hit = []
    signal.signal(signal.SIGINT, lambda signum, frame: hit.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN if hit else _interrupt)
    if hit:
        raise KeyboardInterrupt


@contextlib.contextmanager
def held():
    """Holds a SIGINT back while the block runs (the run log's writes, whose h5py objects run weakref
    callbacks as they are freed) and raises its KeyboardInterrupt after the block, in this frame. The
    handler is swapped for one that only records (as in `interrupt_after`) rather than the signal blocked:
    pthread_sigmask holds it back from the main thread only, and the kernel then hands it to one of torch's
    or MPI's threads, after which Python runs the handler in the main thread all the same. A SIGINT whose
    KeyboardInterrupt was swallowed anyway (the early handler's) is raised here too."""
    if threading.current_thread() is not threading.main_thread():     # no handler can be swapped there
        yield
        return
    before = len(_interrupts)
    with interrupt_after():
        yield
    if len(_interrupts) > before:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred():
    """Holds SIGINT/SIGTERM/SIGUSR1 back while a run-log row is written, so that a Ctrl-C cannot leave a
    half-appended row; a signal that arrived meanwhile is delivered at the end."""
    sigs = {signal.SIGINT, *STOP_SIGNALS}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def requested() -> bool:
    return bool(_received)


def received() -> str:
    """Names of the stop signals this rank received, e.g. 'SIGTERM' ('' if none)."""
    return ",".join(dict.fromkeys(_received))


def reset():
    _received.clear()


def stop_error(round_, ranks=None) -> StopRequested:
    """The StopRequested raised on every rank once the job agreed to stop with `round_` rounds done."""
    who = f" on {ranks} rank(s)" if ranks else ""
    own = f" (this rank: {received()})" if requested() else ""
    how = (_sweeping[-1] if _sweeping else None) or "continue with --resume"
    e = StopRequested(f"stop requested by SIGTERM/SIGUSR1{who}{own}: stopped after round {round_} with a "
                      f"checkpoint; {how}")
    e.round = round_
    return e


def start_mpi():
    """mpi4py's MPI module, MPI_Init (which its import calls) whole: a Ctrl-C meanwhile is raised once it has
    returned (fedmpi.mpi.signals.held). A rank inside MPI_Init hears no Ctrl-C until every rank has joined."""
    test_pause("mpi_init")
    with held():
        from mpi4py import MPI
    test_pause("claim")         # MPI is up; the claim of `out` comes next (fedmpi.cli)
    return MPI
