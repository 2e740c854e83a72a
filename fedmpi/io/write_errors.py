"""A write of a run that fails (a full disk, an I/O error) ends the run with one line naming the file and the
system's reason, exit 1: no HDF5 error spam on the way and no crash on the way out.

HDF5 cannot be trusted after a write of its own failed (measured with h5py 3.16 / HDF5 2.0 on a full tmpfs):
the metadata it could not write is retried each time an h5py object is freed, each retry printed as a
traceback (Cython prints an exception raised in `__dealloc__` itself, through sys.excepthook, ~60 of them for
one checkpoint), and closing that file - or HDF5's own clean-up when the process exits - segfaults. So:
- the writers reserve room first (fedmpi.io.disk_room), so that a full disk refuses the write before HDF5
  sees it; what still reaches HDF5 (an I/O error, a file system that cannot reserve) is handled here:
- `writing(path)` turns any failure inside a write into WriteFailed(path, the system's reason). Where the
  failure came from HDF5 (an h5py exception, or a failed flush that h5py only printed), HDF5 is marked
  `broken`: the file's handle is kept (`keep`), never closed, and the process ends through `end_process`
  (os._exit after its last line and MPI's launcher sees the exit code: MPICH's hydra then ends the other
  ranks quietly), skipping the clean-up that would crash.
- The tracebacks of h5py's failed frees are dropped (sys.excepthook and sys.unraisablehook filters that
  pass everything else on), and HDF5's own error printing is off (h5py's silence_errors).

Test aid: FEDMPI_TEST_WRITE_FAIL="KIND:N[:ERRNO],..." makes the Nth write of KIND in this process raise
OSError(ERRNO, default ENOSPC) where `inject(KIND, path)` is called, before that write touches the file:
rows (a batch of run.h5 rows), model (the final model), checkpoint (one dataset of a checkpoint), commit (a
checkpoint's closing and renaming), tracker (one round of a tracker).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys

import h5py

from fedmpi.core.errors import FedmpiError
from fedmpi.io.disk_room import WriteFailed, reason

FAIL_ENV = "FEDMPI_TEST_WRITE_FAIL"
# The writes the test aid can fail, and what one of them is.
KINDS = {"rows": "a batch of run.h5 rows", "model": "the final model into run.h5",
         "checkpoint": "one dataset of a checkpoint", "commit": "a checkpoint's closing and renaming",
         "tracker": "one write of the TensorBoard tracker"}
# What a failing disk says: the write cannot succeed by trying again later or elsewhere in the run.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS})

_counts = {}            # kind -> writes of that kind so far (the test aid's count)
_kept = []              # handles of files HDF5 failed to write: never freed, never closed
_state = {"broken": None, "freed_failures": 0}


class InjectedFault(OSError):
    """The test aid's failure: raised before the write touched its file, so HDF5 is not broken by it."""


def inject(kind, path):
    """Test aid (see the module docstring): raises InjectedFault at the write FEDMPI_TEST_WRITE_FAIL names."""
    spec = os.environ.get(FAIL_ENV)
    if not spec:
        return
    assert kind in KINDS, kind
    _counts[kind] = _counts.get(kind, 0) + 1
    for item in spec.split(","):
        parts = item.strip().split(":")
        if parts[0] == kind and len(parts) >= 2 and int(parts[1]) == _counts[kind]:
            code = getattr(errno, parts[2]) if len(parts) > 2 else errno.ENOSPC
            raise InjectedFault(code, os.strerror(code), str(path))


def is_disk_error(error):
    return isinstance(error, OSError) and error.errno in DISK_ERRNOS


def broken():
    """The reason HDF5 failed a write in this process (None while it has not)."""
    return _state["broken"]


def keep(handle):
    """A handle on a file HDF5 failed to write: kept alive unclosed (freeing or closing it crashes)."""
    if handle is not None:
        try:
            name = os.path.abspath(handle.filename)
        except Exception:  # noqa: BLE001 - the name is only for `unusable`
            name = None
        _kept.append((name, handle))


def unusable(path):
    """Whether HDF5 failed writing the file at `path` in this process (nothing more can be written to it)."""
    return any(name == os.path.abspath(path) for name, _ in _kept)


class writing:
    """Context for one write to `path`: a failure inside it becomes WriteFailed naming `path` with the system's
    reason (once HDF5 printed a failed flush that it did not raise, that too), after removing the temporary
    file `discard` (if any). `handle` (the h5py file the block writes, if set) is closed, or kept unclosed
    where HDF5 failed."""

    def __init__(self, path, discard=None):
        self.path, self.discard, self.handle = path, discard, None

    def __enter__(self):
        self._freed = _state["freed_failures"]
        return self

    def __exit__(self, kind, error, tb):
        if error is None and _state["freed_failures"] == self._freed:
            return False
        if error is not None and (not isinstance(error, Exception)
                                  or isinstance(error, FedmpiError) and not isinstance(error, WriteFailed)):
            return False            # KeyboardInterrupt, a refusal (InputError...): not a failed write
        if error is None or _raised_in_h5py(tb):
            _state["broken"] = _state["broken"] or (reason(error) if error is not None else "a failed flush")
            keep(self.handle)
        elif self.handle is not None:
            try:                    # HDF5 itself is sound: the write stopped before touching the file
                self.handle.close()
            except Exception:  # noqa: BLE001 - the write failed already; that is the error to report
                pass
        if self.discard:
            try:
                os.remove(self.discard)
            except OSError:
                pass
        if isinstance(error, WriteFailed):
            return False
        raise WriteFailed(self.path, reason(error) if error is not None else _state["broken"]) from None


@contextlib.contextmanager
def h5_file(name, path, mode, discard=None, **kwargs):
    """h5py.File(path, mode, ...) for one write (`writing(name, discard)`), closed after the block."""
    with writing(name, discard) as w:
        w.handle = h5py.File(path, mode, **kwargs)
        yield w.handle
        w.handle.close()


def end_process(code, abort=None):
    """Ends this process with `code` at once (see the module docstring): the room reserved on disk given back
    and everything printed out first; no interpreter or HDF5 clean-up. `abort` (MPI_Abort, where the job
    has other ranks) ends them too: MPICH's MPI_Abort calls exit(), whose handlers include HDF5's, so a
    handler registered after HDF5's (they run last-registered first) leaves with `code` before it."""
    from fedmpi.core import console
    from fedmpi.io import disk_room

    disk_room.release_all()
    console.drain()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if abort is not None:
        try:
            handler = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)(lambda status, arg: os._exit(code))
            _kept.append((None, handler))       # alive until the process ends
            ctypes.CDLL(None).on_exit(handler, None)
        except (OSError, AttributeError):
            os._exit(code)      # no on_exit (not glibc): leave alone; the launcher ends the other ranks
        abort(code)
    os._exit(code)


# -- h5py's failed frees ---------------------------------------------------------------------------

def _raised_in_h5py(tb):
    """Whether the exception came out of h5py (HDF5 failed), not out of the os module or fedmpi's own checks."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.startswith("h5py/") or f"{os.sep}h5py{os.sep}" in name:
            return True
        tb = tb.tb_next
    return False


def _from_h5py_free(tb):
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.endswith("_objects.pyx") \
        and "dealloc" in tb.tb_frame.f_code.co_name


def _freed_failure(error):
    _state["freed_failures"] += 1
    _state["broken"] = _state["broken"] or reason(error)


def _install():
    h5py._errors.silence_errors()
    previous_hook, previous_unraisable = sys.excepthook, sys.unraisablehook

    def excepthook(kind, error, tb):
        if _from_h5py_free(tb) and not os.environ.get("FEDMPI_DEBUG"):
            _freed_failure(error)
            return
        previous_hook(kind, error, tb)

    def unraisablehook(unraisable):
        if isinstance(unraisable.object, str) and unraisable.object.startswith("h5py.") \
                and not os.environ.get("FEDMPI_DEBUG"):
            _freed_failure(unraisable.exc_value)
            return
        previous_unraisable(unraisable)

    sys.excepthook, sys.unraisablehook = excepthook, unraisablehook


_install()
