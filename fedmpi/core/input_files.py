"""How every command opens the files it reads: config files, sweep specs, data files (`data.root` and what lies
under it), deployment traces, indexes and markers, checkpoints and run files.

The input rule (docs/reference/inputs-and-outputs.md):
- a path read as input must be a regular file or a link to one; a FIFO, a device (/dev/zero, /dev/urandom, a
  terminal) or a socket is refused with one line naming the key or argument and the path (exit 2),
  before a byte is read: such a "file" has no end, or blocks until another process writes to it;
- the file is checked twice: by path before it is opened (so that opening a device has no side effect) and
  on the opened descriptor (so that a file swapped for a FIFO or a device between the two is caught too).
  Opening uses O_NONBLOCK, so that opening a FIFO returns at once instead of waiting for a writer; the flag
  is cleared once the descriptor is known to be a regular file;
- what is read is bounded by the file's size as fstat gives it on that descriptor (`read_input`), never
  "until the end": a file that grows while it is read is read up to the size it had when it was opened;
- nested text formats are bounded in depth: YAML by fedmpi.config.yamlio (MAX_DEPTH), JSON here
  (`parse_json`: a document Python's parser cannot nest into, or deeper than `max_depth`, is refused with
  its file named).

Files that a library opens by path (h5py, np.memmap, np.fromfile, `datasets`) go through `check_input`, the
check by path, just before the library opens them.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat

from fedmpi.core.config_checks import show
from fedmpi.core.errors import InputError

MAX_JSON_DEPTH = 64     # fedmpi's own JSON (indexes, markers) is three levels deep; LEAF's files four

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _kind(path, mode):
    """What a non-regular file is, in words, with the target of a link (`a link to /dev/zero, a character
    device`)."""
    kind = next((words for test, words in _KINDS if test(mode)), "not a regular file")
    if os.path.islink(path):
        kind = f"a link to {show(os.path.realpath(path), 200)}, {kind}"
    return kind


def refusal(path, what, mode, error=InputError):
    """The error for an input `path` that is not a regular file; `what` names the key or argument and the path
    (default: the path alone)."""
    where = what or show(str(path), 300)
    return error(f"{where}: {_kind(path, mode)}, not a regular file; give the path of a regular file (or of a "
                 f"link to one)")


def check_input(path, what=None, error=InputError) -> os.stat_result:
    """The stat of `path` (links followed) when it is a regular file; `error` naming `what` otherwise. A
    missing or unreadable path raises the OSError os.stat raised, a folder IsADirectoryError, as `open` would
    (callers say those in their own words)."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):       # as `open` says it: callers have their own words for a folder
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(st.st_mode):
        raise refusal(path, what, st.st_mode, error)
    return st


def open_input(path, what=None, mode="rb", encoding=None, error=InputError):
    """`path` opened for reading (`mode` "rb" or "r") when it is a regular file, checked by path and on the
    opened descriptor (see the module docstring); `error` naming `what` otherwise. OSError as `open` raises."""
    if mode not in ("rb", "r"):
        raise ValueError(f"open_input reads only: mode {mode!r}")
    check_input(path, what, error)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):        # swapped since the check by path
            raise refusal(path, what, st.st_mode, error)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, mode, encoding=encoding if mode == "r" else None)
    except BaseException:
        os.close(fd)
        raise


def read_input(path, what=None, at_most=None, error=InputError) -> bytes:
    """The bytes of the regular file `path` (`open_input`), at most its size when opened and at most `at_most`."""
    with open_input(path, what, error=error) as fh:
        size = os.fstat(fh.fileno()).st_size
        return fh.read(size if at_most is None else min(size, at_most))


def parse_json(data, where, max_depth=None, error=InputError, **loads_args):
    """The JSON value of `data` (bytes or text); `error` naming `where` for a document nested deeper than
    Python's parser goes (RecursionError) or than `max_depth`. Other parse errors (ValueError) propagate."""
    try:
        value = json.loads(data, **loads_args)
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read; not a file fedmpi or LEAF writes") from None
    if max_depth is not None and _deeper_than(value, max_depth):
        raise error(f"{where}: JSON nested deeper than {max_depth} levels; not a file fedmpi or LEAF writes")
    return value


def _deeper_than(value, limit) -> bool:
    """Whether `value` (parsed JSON) nests lists or dicts more than `limit` levels; iterative, so that the
    check itself cannot exhaust the stack."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False
