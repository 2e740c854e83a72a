"""Terminal output that cannot change a run's outcome: a broken pipe (`fedmpi run ... 2>&1 | head -c 10`),
a closed or full terminal. A failed write silences the stream for the rest of the process instead of raising:
its descriptor is pointed at /dev/null, so later writes and the interpreter's final flush at exit (which
would otherwise report the broken pipe and turn exit 0 into 120) succeed and go nowhere. What happened is
in run.h5 either way."""

from __future__ import annotations

import os
import stat
import struct
import sys
import time


def write(text, stream=None) -> bool:
    """Writes and flushes `text` to `stream` (default: the current sys.stderr); False, and the stream
    silenced, if that failed."""
    stream = sys.stderr if stream is None else stream
    if stream is None:
        return False
    try:
        stream.write(text)
        stream.flush()
        return True
    except (OSError, ValueError):       # EPIPE, EIO, ENOSPC; ValueError: a closed file object
        silence(stream)
        return False


def say(line, stream=None) -> bool:
    """One line (a newline added)."""
    return write(line + "\n", stream)


def silence(stream):
    """Points `stream`'s descriptor at /dev/null (best effort: a stream without one is left as it is)."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


def drain(timeout_s=1.0, fds=(1, 2)):
    """Flushes stdout and stderr, then waits (at most `timeout_s`) until whichever of the descriptors `fds`
    are pipes have been read. Called just before MPI_Abort: under mpiexec a rank's output reaches the terminal
    through a pipe to the launcher's proxy, and an abort right after a write can end the job before the proxy
    has read it, so the line is lost (Hydra dropped rank 0's `fedmpi: interrupted` now and then). Once the
    proxy has read the line it forwards it ahead of the abort, which reaches it later. A file or a terminal
    needs no wait; a pipe nobody reads costs `timeout_s`."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    deadline = time.monotonic() + timeout_s
    for fd in fds:
        while _unread_bytes(fd) and time.monotonic() < deadline:
            time.sleep(0.005)


def _unread_bytes(fd) -> int:
    """Bytes written to the pipe `fd` and not yet read (0 for anything that is not a pipe)."""
    try:
        import fcntl
        import termios

        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except (ImportError, OSError):
        return 0
