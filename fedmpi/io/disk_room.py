"""Room on disk before every run-log write, so that a full disk never costs the rounds already logged.

A full disk must not cost the rounds already logged. HDF5 cannot survive a failed write: measured with
h5py 3.16 / HDF5 2.0, a flush that meets ENOSPC segfaults or leaves a file that no longer opens ("addr
overflow"), and so does growing an attribute on a full disk. So every write first reserves the room it
can need (`_ensure_room`): the largest amount it can add (a new chunk of every dataset it touches, the
model, the attributes) plus a slack for HDF5's metadata. The reservation is real where the file system
allows it: `fallocate(FALLOC_FL_KEEP_SIZE)` allocates the blocks past the end of the file without
changing its size, so a full disk, a quota (which statvfs cannot see) or another job filling the disk
makes the reservation fail, before anything is written, and never the write itself. Where the file
system cannot reserve (NFS v3, some Lustre and ZFS versions) the free space is checked with statvfs
instead, which a quota or a concurrent writer can still defeat. The file-size limit (RLIMIT_FSIZE) is
checked too. A refused write raises WriteFailed ("cannot write OUT/run.h5: No space left on device",
exit 1) and leaves the file as it was after the last complete round.

The blocks reserved for the last write stay reserved past the end of the file while the process runs,
so the final status (`failed`, and the error's detail) can still be written when something else, e.g. a
checkpoint, filled the disk; they are given back when the process exits.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import os
import re
import resource

from fedmpi.core.errors import FedmpiError

# Room reserved beyond a write's own data for HDF5's metadata. Measured: appending a row to a run with
# 1,000 clients writes ~50 kB of metadata besides its chunks; attribute updates a few kB.
SLACK_BYTES = 1 << 20
ATTR_SLACK_BYTES = 64 << 10
FALLOC_FL_KEEP_SIZE = 0x01
CANNOT_RESERVE = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV)


class WriteFailed(FedmpiError):
    """run.h5 could not be written (no space, file too large, I/O error); the file keeps its last good state."""

    def __init__(self, path, reason):
        super().__init__(f"cannot write {path}: {reason}")
        self.path, self.reason = path, reason


def ensure_room(path, nbytes, written=None, slack=SLACK_BYTES):
    """Reserves room for `written` (default `path`) to grow by `nbytes` + `slack`, or raises WriteFailed:
    blocks allocated past its end where the file system can (see the module docstring), else enough free
    space for this user (statvfs); and below the process's file-size limit either way."""
    written = written or path
    need = nbytes + slack
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        size = os.path.getsize(written) if os.path.exists(written) else 0
        if size + need > limit:
            raise WriteFailed(path, os.strerror(errno.EFBIG))
    try:
        if os.path.exists(written) and reserve(written, need):
            return
        st = os.statvfs(os.path.dirname(os.path.abspath(written)))
    except OSError as e:
        raise WriteFailed(path, e.strerror or str(e)) from None
    if st.f_bavail * st.f_frsize < need:
        raise WriteFailed(path, os.strerror(errno.ENOSPC))


def libc_fallocate():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


FALLOCATE = libc_fallocate()
RESERVED = set()       # files holding blocks past their end, given back at exit


def reserve(path, nbytes, offset=None):
    """Allocates `nbytes` past the end of `path` (from `offset` if given) without changing its size. False where
    the file system (or the platform) cannot; OSError (ENOSPC, EDQUOT, ...) where there is no room."""
    if FALLOCATE is None:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        start = os.fstat(fd).st_size if offset is None else offset
        if FALLOCATE(fd, FALLOC_FL_KEEP_SIZE, start, nbytes) == 0:
            if not RESERVED:
                atexit.register(release_all)
            RESERVED.add(os.path.abspath(path))
            return True
        code = ctypes.get_errno()
    finally:
        os.close(fd)
    if code in CANNOT_RESERVE:
        return False
    raise OSError(code, os.strerror(code))


class Room:
    """Room for a new file that grows write by write (a checkpoint): every block from its start up to a
    high-water mark is reserved, so HDF5 can neither meet a full disk writing data past the end nor
    writing the metadata it allocated earlier (held in its cache, below the end) when it flushes. Each
    `ensure` reserves only what lies above the mark. Errors name `name` (the file the user knows)."""

    def __init__(self, path, name):
        self.path, self.name, self.upto = path, name, 0

    def ensure(self, end, slack=SLACK_BYTES):
        """Room for the file to reach `end` bytes plus `slack`, or WriteFailed."""
        want = end + slack
        if want <= self.upto:
            return
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and want > limit:
            raise WriteFailed(self.name, os.strerror(errno.EFBIG))
        try:
            if not reserve(self.path, want - self.upto, offset=self.upto):
                st = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
                if st.f_bavail * st.f_frsize < want - os.path.getsize(self.path):
                    raise WriteFailed(self.name, os.strerror(errno.ENOSPC))
        except OSError as e:
            raise WriteFailed(self.name, e.strerror or str(e)) from None
        self.upto = want

    def release(self):
        """Gives back the blocks reserved past the file's end (once it is complete)."""
        try:
            os.truncate(self.path, os.path.getsize(self.path))
        except OSError:
            pass
        RESERVED.discard(os.path.abspath(self.path))


def release_all():
    """Gives back the blocks reserved past the end of each file (truncating a file to its own size frees them).
    A process ended by MPI_Abort or os._exit skips this; its file keeps at most one write's reservation."""
    for path in RESERVED:
        try:
            os.truncate(path, os.path.getsize(path))
        except OSError:
            pass


def reason(error):
    """The system's words for a failed write ('No space left on device'), from an OSError or from the errno
    HDF5 quotes in its message; else the message's first line."""
    code = getattr(error, "errno", None)
    if not code:
        m = re.search(r"errno = (\d+)", str(error))
        code = int(m.group(1)) if m else None
    if code:
        return os.strerror(code)
    return (str(error).splitlines() or [type(error).__name__])[0][:200]
