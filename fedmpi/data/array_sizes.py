"""The memory a data set file's arrays will take, told from their shapes and dtypes before any is read.

A file may declare arrays far larger than itself (an HDF5 dataset chunked and compressed, or declared and
never written; an .npz member's header): reading one then dies of MemoryError, in `--dry-run` too. The
arrays source (fedmpi.data.arrays) reads the shapes first and refuses, naming the file and its largest
array, what cannot fit in this node's memory (the whole data set is held in memory, once per node).
"""

from __future__ import annotations

import math

import numpy as np

from fedmpi.core.errors import InputError

GB = 1e9


def node_memory_bytes():
    """This node's total memory (MemTotal), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        return int(info["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def held_bytes(key, shape, dtype):
    """Bytes of array `key` as the data set holds it (fedmpi.data.checked_arrays): float inputs as float32,
    integer inputs, labels and client ids as int64."""
    dtype = np.dtype(dtype)
    if key.startswith("x_") and dtype.kind == "f":
        return math.prod(shape) * 4
    return math.prod(shape) * max(8, dtype.itemsize)


def refuse_beyond_memory(specs, where, total=None):
    """InputError unless the arrays of `specs` ({key: (shape, dtype)}) fit in this node's memory (`total`
    bytes, default MemTotal; nothing is refused where it cannot be read)."""
    total = node_memory_bytes() if total is None else total
    held = {key: held_bytes(key, shape, dtype) for key, (shape, dtype) in specs.items()}
    need = sum(held.values())
    if total is None or need <= total:
        return
    key = max(held, key=held.get)
    shape, dtype = specs[key]
    raise InputError(f"{where}: its arrays would take {need / GB:.1f} GB of memory ({key}, shape "
                     f"{tuple(shape)} {np.dtype(dtype)}, alone {held[key] / GB:.1f} GB), more than this node's "
                     f"{total / GB:.1f} GB; fedmpi holds the whole data set in memory: use a file whose arrays "
                     f"fit (fewer or smaller samples)")
