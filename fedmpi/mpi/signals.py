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
"""

from __future__ import annotations

import contextlib
import signal

from fedmpi.core.errors import StopRequested

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received = []


def _handler(signum, frame):
    _received.append(signal.Signals(signum).name)


def _interrupt(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def install():
    """Turns SIGTERM/SIGUSR1 into stop requests and SIGINT into one KeyboardInterrupt for this process
    (call from the main thread)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _handler)
    signal.signal(signal.SIGINT, _interrupt)


def ignore_all():
    """The job's work is done: further signals change nothing. (Python resets the handlers it installed to
    the default at exit, before MPI finalizes; an ignored signal stays ignored, so a late SIGTERM cannot kill
    a finished rank with status 15.)"""
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
    e = StopRequested(f"stop requested by SIGTERM/SIGUSR1{who}{own}: stopped after round {round_} with a "
                      f"checkpoint; continue with --resume")
    e.round = round_
    return e
