"""CIFAR's python batches, read without running code. They are pickles; a restricted unpickler resolves only
numpy's array reconstruction (and latin-1 text for bytes), builds every array from its own bytes checked
against its shape and dtype, and refuses anything else, so a crafted batch can neither run code nor pass
uninitialised memory off as pixels."""

from __future__ import annotations

import io
import pickle

import numpy as np

from fedmpi.core.config_checks import show
from fedmpi.core.errors import InputError
from fedmpi.core.input_files import read_input

CIFAR_PIXELS = 3 * 32 * 32


def _latin1_bytes(text, encoding):
    """What `_codecs.encode` does in a protocol-2 pickle of bytes written by Python 3, and nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is allowed only for latin-1 text")
    return text.encode("latin1")


class _NdarrayName:
    """What the name numpy.ndarray resolves to: the class argument of `_reconstruct`, never callable. Called
    by itself (REDUCE), the real ndarray would build an uninitialised array of any shape, whose memory a
    crafted batch would pass off as pixels."""

    def __init__(self, *args, **kwargs):
        raise pickle.UnpicklingError("numpy.ndarray called directly: arrays in a CIFAR batch are rebuilt from "
                                     "their bytes, never created empty")


class _PendingArray:
    """`_reconstruct(ndarray, shape, dtype)`: numpy would return an uninitialised array of that shape, filled
    only by the BUILD opcode's __setstate__ that follows. Here the array exists only once __setstate__ has
    brought its data, checked: raw bytes (not a list of objects) whose length is what the shape and dtype
    say. A batch that leaves the BUILD out keeps this stand-in, which `_arrays` refuses."""

    def __init__(self):
        self.array = None

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5):
            raise pickle.UnpicklingError("an array's state is not numpy's (version, shape, dtype, order, data)")
        _, shape, dtype, fortran, data = state
        if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(data, (bytes, bytearray)):
            raise pickle.UnpicklingError("an array must hold plain numbers given as raw bytes")
        if not (isinstance(shape, tuple) and all(isinstance(n, int) and n >= 0 for n in shape)):
            raise pickle.UnpicklingError(f"an array's shape must be a tuple of sizes, found {show(shape)}")
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(data) != expected:
            raise pickle.UnpicklingError(f"an array of shape {shape} and dtype {dtype} needs {expected} bytes, "
                                         f"its data has {len(data)}")
        self.array = np.frombuffer(bytearray(data), dtype=dtype).reshape(shape, order="F" if fortran else "C")


def _reconstruct(cls, shape, dtype):
    """Stand-in for numpy's array reconstructor (`_PendingArray`); the arguments (ndarray, (0,), b'b' as numpy
    writes them) are ignored, the state decides the array."""
    if cls is not _NdarrayName:
        raise pickle.UnpicklingError("_reconstruct is allowed only for numpy.ndarray")
    return _PendingArray()


def _numpy_globals():
    """The only globals a CIFAR batch names: the official ones (Python 2) numpy's array reconstructor,
    ndarray and dtype (numpy.core.multiarray._reconstruct in numpy 1, numpy._core... in numpy 2); batches
    re-pickled by Python 3 also bytes (protocol 2) or numpy's _frombuffer (protocol 5), which builds its
    array from a bytes object of the right length (numpy checks it) and so needs no stand-in."""
    frombuffer = np.ndarray.__reduce_ex__(np.zeros(1), 5)[0]
    allowed = {("numpy", "ndarray"): _NdarrayName, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _latin1_bytes}
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = _reconstruct
        allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return allowed


def _arrays(value):
    """`value` with a filled `_PendingArray` replaced by its array; UnpicklingError for one never filled."""
    if isinstance(value, _PendingArray):
        if value.array is None:
            raise pickle.UnpicklingError("an array is created without its data (no __setstate__ follows numpy's "
                                         "_reconstruct): its contents would be uninitialised memory")
        return value.array
    if isinstance(value, list):
        return [_arrays(v) for v in value]
    return value


class BatchRefused(Exception):
    def __init__(self, module, name):
        super().__init__(f"{module}.{name}")


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy's array reconstruction (find_class is also what the extension
    registry opcodes go through, so nothing reaches other code)."""

    ALLOWED = _numpy_globals()

    def find_class(self, module, name):
        found = self.ALLOWED.get((module, name))
        if found is None:
            raise BatchRefused(module, name)
        return found


def read_cifar_batch(path, label_key):
    """(uint8 images N x 3 x 32 x 32, int64 labels) of one CIFAR python batch; InputError naming the file."""
    try:
        raw = read_input(path, f"{path} (under data.root)")
        # latin1: the official batches were pickled by Python 2, whose byte strings hold the pixels.
        entry = _BatchUnpickler(io.BytesIO(raw), encoding="latin1").load()
        if isinstance(entry, dict):
            entry = {k: _arrays(v) for k, v in entry.items()}
    except BatchRefused as e:
        raise InputError(f"{path}: not a CIFAR batch: it refers to {e}, which a CIFAR batch never contains; "
                         f"fedmpi does not load it (a crafted pickle could run code)") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    except InputError:      # not a regular file, said by read_input
        raise
    except Exception as e:  # noqa: BLE001 - a damaged pickle raises many types
        raise InputError(f"{path}: not a CIFAR python batch ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(entry, dict):
        raise InputError(f"{path}: not a CIFAR batch (a dict with 'data' and {label_key!r}), found "
                         f"{type(entry).__name__}")
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    data, labels = entry.get("data"), entry.get(label_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR_PIXELS:
        found = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise InputError(f"{path}: 'data' must be uint8 pixels, {CIFAR_PIXELS} per image (N x {CIFAR_PIXELS}), "
                         f"found {found}")
    try:
        labels = np.asarray(labels)
    except (ValueError, TypeError):
        labels = np.asarray([None])
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != len(data):
        raise InputError(f"{path}: {label_key!r} must be one integer label per image ({len(data)}), found "
                         f"{labels.dtype} {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)
