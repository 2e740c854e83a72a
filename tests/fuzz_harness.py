"""The property's machinery of the fuzz tests (tests/test_fuzz*.py, through fuzz_support, which re-exports
these names): fedmpi's CLI called in this process with a time and an address-space bound (`cli`, an
`Outcome`), the claims a refused run must not leave behind, and snapshots of a folder's bytes and a run's
status. Kept apart from fuzz_support.py's generators (the Hypothesis profiles and the strategies for config
values and hostile inputs): this half runs one example and judges it, without Hypothesis."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import resource
import signal
import stat
import time
import traceback

from fedmpi.cli import main

EXAMPLE_SECONDS = 60            # one example: a dry run takes well under a second, a tiny real run one or two
EXTRA_ADDRESS_SPACE = 4 << 30   # bytes of address space an example may add to this process


class Hung(BaseException):
    """An example ran past EXAMPLE_SECONDS (a BaseException: fedmpi's `except Exception` must not catch it)."""


def _alarm(signum, frame):
    raise Hung(f"the example ran past {EXAMPLE_SECONDS} s")


def _address_space():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return None


@contextlib.contextmanager
def bounded(seconds=EXAMPLE_SECONDS, extra=EXTRA_ADDRESS_SPACE):
    """A time bound (SIGALRM raising Hung) and a memory bound (RLIMIT_AS lowered to this process's size plus
    `extra`, so an allocation beyond it is a MemoryError inside the example) for one in-process example."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    # pytest-timeout may have its own alarm running (its signal method): it is put back, less the time spent.
    pending, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = _address_space()
    if size is not None:
        limit = size + extra if hard == resource.RLIM_INFINITY else min(hard, size + extra)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if pending:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, pending - (time.monotonic() - started)))
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@dataclasses.dataclass
class Outcome:
    code: object
    out: str
    err: str
    crash: str | None = None       # the traceback of an exception that escaped fedmpi.cli.main

    def problems(self, allowed=(0, 2)):
        found = []
        if self.crash:
            found.append(f"an exception escaped main:\n{self.crash}")
        if self.code not in allowed:
            found.append(f"exit {self.code!r}, allowed {allowed}")
        if "Traceback" in self.err:
            found.append("a traceback in stderr")
        return found

    def check(self, allowed=(0, 2), what=""):
        problems = self.problems(allowed)
        assert not problems, (f"{what}\n" + "\n".join(problems) + f"\n--- stderr:\n{self.err[-3000:]}"
                              f"\n--- stdout:\n{self.out[-1500:]}")




def cli(*argv, seconds=EXAMPLE_SECONDS, extra=EXTRA_ADDRESS_SPACE):
    """`fedmpi ARGV` in this process, bounded; the exit code (SystemExit included), stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    code, crash = None, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), bounded(seconds, extra):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:
                code = e.code if e.code is not None else 0
    except (Exception, Hung) as e:  # noqa: BLE001 - any exception out of main is the finding
        crash = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]
    finally:
        release_claims()
    return Outcome(code, out.getvalue(), err.getvalue(), crash)


def release_claims():
    """Drops the `out` locks this process took (fedmpi keeps them for the life of the process; each example
    has its own folder, so without this every example would leave a descriptor open)."""
    from fedmpi.io import outdir

    for held in list(outdir._HELD.values()):
        held.release()


def snapshot(folder):
    """{relative path: sha256} of every file under `folder` (links by their target; a device node, FIFO or
    socket by its kind and device number, never opened: reading a FIFO would block). The lock file is left
    out: it records the job that holds `out` (host, pid, time), not the run."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel == ".fedmpi.lock":
                continue
            mode = os.lstat(path)
            if os.path.islink(path):
                found[rel] = "link:" + os.readlink(path)
            elif not stat.S_ISREG(mode.st_mode):
                found[rel] = f"node:{stat.S_IFMT(mode.st_mode):o}:{mode.st_rdev}"
            else:
                with open(path, "rb") as fh:
                    found[rel] = hashlib.sha256(fh.read()).hexdigest()
    return found


def run_status(out):
    """The status attribute of OUT/run.h5, or None."""
    import h5py

    try:
        with h5py.File(os.path.join(out, "run.h5"), "r", locking=False) as f:
            status = f.attrs.get("status")
    except (OSError, KeyError):
        return None
    return status.decode() if isinstance(status, bytes) else status
