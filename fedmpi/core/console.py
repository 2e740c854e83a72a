"""Terminal output that cannot change a run's outcome: a broken pipe (`fedmpi run ... 2>&1 | head -c 10`),
a closed or full terminal. A failed write silences the stream for the rest of the process instead of raising:
its descriptor is pointed at /dev/null, so later writes and the interpreter's final flush at exit (which
would otherwise report the broken pipe and turn exit 0 into 120) succeed and go nowhere. What happened is
in run.h5 either way."""

from __future__ import annotations

import os
import sys


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
