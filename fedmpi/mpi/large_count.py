"""Messages beyond MPI's int counts: a flat vector of a billion-parameter model is over 2^31
bytes, where MPI-3's `int count` and `int displs[]` end (APPFL#112: a gather failing above 2^31 bytes).

What this machine offers: mpi4py >= 4 calls MPI-4's large-count routines (`MPI_Bcast_c`, `MPI_Reduce_c`,
`MPI_Isend_c`...) by itself when a count does not fit an int and the library has them (MPICH >= 4.0,
Open MPI >= 5.0; the venv's MPICH wheel is MPI 5.0). A site MPI of the MPI-3 generation (Open MPI 4.x is
MPI-3.1) has none, and mpi4py then raises OverflowError. So every call here moves a large buffer as
consecutive slices of at most `limit_bytes()` bytes when the library lacks large counts, and in one call
where it has them. Slicing is exact: broadcast and element-wise reduction of a slice are the whole call's
on that slice (the same additions in the same order, so sums are bit-identical), and point-to-point
slices with one tag arrive in the order sent (MPI's non-overtaking rule).

Gathers are always sliced by columns above GATHER_BYTES, whatever the library: their displacement arrays
count elements of the whole receive buffer, and whether mpi4py moves to `MPI_Gatherv_c` for displacements
(rather than counts) beyond an int is not part of its documented interface. Each slice also bounds rank 0's
extra memory to one slice. Every rank knows how many slices there are: the number of rows is the round
plan's (known everywhere), not what each rank sends.

Test aid: FEDMPI_MPI_CHUNK_BYTES sets the slice limit (bytes) for every call, so that the slicing runs in CI
with small vectors (tests/test_large_count.py).
"""

from __future__ import annotations

import os

import numpy as np

INT_MAX = 2**31 - 1
CHUNK_ENV = "FEDMPI_MPI_CHUNK_BYTES"
GATHER_BYTES = INT_MAX       # one gather call receives at most this many bytes in all


def has_large_count(mpi):
    """Whether mpi4py can call the MPI-4 large-count routines here (library MPI >= 4.0, mpi4py >= 4)."""
    import mpi4py

    return mpi.Get_version() >= (4, 0) and int(mpi4py.__version__.split(".")[0]) >= 4


def limit_bytes(mpi):
    """The most bytes one broadcast, reduction or message moves: FEDMPI_MPI_CHUNK_BYTES where set, None (no
    limit) with large counts, else INT_MAX (so that counts stay under 2^31 both in elements and in bytes)."""
    env = os.environ.get(CHUNK_ENV)
    if env:
        return max(1, int(env))
    return None if has_large_count(mpi) else INT_MAX


def gather_limit(mpi):
    """The most bytes one gather receives in all (see the module's note)."""
    env = os.environ.get(CHUNK_ENV)
    return max(1, int(env)) if env else GATHER_BYTES


def _flat(buf):
    return buf.reshape(-1)


def _itemsize(buf):
    return buf.element_size() if hasattr(buf, "element_size") else buf.itemsize


def slices(n, itemsize, limit):
    """Consecutive slices covering range(n), each of at most `limit` bytes (at least one element); one slice
    when `limit` is None. An empty vector still gives one (empty) slice: every rank makes the same calls."""
    if limit is None or n * itemsize <= limit:
        return [slice(0, n)]
    step = max(1, limit // itemsize)
    return [slice(a, min(n, a + step)) for a in range(0, n, step)]


def bcast(comm, mpi, buf, root=0):
    """`comm.Bcast` of a contiguous array (numpy, or a device tensor with CUDA-aware MPI), sliced as needed."""
    flat = _flat(buf)
    for s in slices(flat.shape[0], _itemsize(buf), limit_bytes(mpi)):
        comm.Bcast(flat[s], root=root)


def reduce_sum(comm, mpi, buf, is_root, root=0, datatype=None):
    """Element-wise MPI SUM of every rank's `buf` into `root`'s (in place there; `is_root` on that rank),
    sliced as needed; `datatype` names the MPI type where mpi4py cannot infer it (UINT64_T for secure
    aggregation). Only the transfers touch `comm` (tests count the calls made on it)."""
    flat = _flat(buf)
    for s in slices(flat.shape[0], _itemsize(buf), limit_bytes(mpi)):
        part = flat[s] if datatype is None else [flat[s], datatype]
        if is_root:
            comm.Reduce(mpi.IN_PLACE, part, op=mpi.SUM, root=root)
        else:
            comm.Reduce(part, None, op=mpi.SUM, root=root)


def isend(comm, mpi, buf, dest, tag):
    """Non-blocking sends of a contiguous array in slices (one tag: they arrive in order); the requests."""
    flat = _flat(buf)
    return [comm.Isend(flat[s], dest=dest, tag=tag) for s in slices(flat.shape[0], _itemsize(buf),
                                                                     limit_bytes(mpi))]


def irecv(comm, mpi, buf, source, tag):
    """The receiving side of `isend`: the same slices of `buf`, received in order; the requests."""
    flat = _flat(buf)
    return [comm.Irecv(flat[s], source=source, tag=tag) for s in slices(flat.shape[0], _itemsize(buf),
                                                                         limit_bytes(mpi))]


def gather_rows(comm, mpi, block, width, bound_rows, rows_by_rank=None, received=None, root=0):
    """Gatherv of every rank's float32 rows `block` ([k_r * width] or [k_r, width]) into `root`'s
    `received` ([sum k_r, width], in rank order). `rows_by_rank[r]` = k_r is needed on `root` only, the
    rank that passes it (None elsewhere); `bound_rows`, an upper bound on sum k_r that every rank knows
    (the round plan's), fixes the number of column slices, so that every rank makes the same calls. One
    call straight into `received` when bound_rows * width floats fit GATHER_BYTES; else column slices
    [a, b), each gathered into a scratch [rows, b - a] on `root` and copied into place."""
    send = np.ascontiguousarray(block, dtype=np.float32).reshape(-1)
    send = send.reshape(send.size // width if width else 0, width)
    columns = slices(width, 4 * max(1, int(bound_rows)), gather_limit(mpi))
    whole = len(columns) == 1
    for cols in columns:
        part = send.reshape(-1) if whole else np.ascontiguousarray(send[:, cols]).reshape(-1)
        if rows_by_rank is None:
            comm.Gatherv(part, None, root=root)
            continue
        w = cols.stop - cols.start
        counts = [int(k) * w for k in rows_by_rank]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        scratch = received if whole else np.empty((sum(rows_by_rank), w), dtype=np.float32)
        comm.Gatherv(part, [scratch.reshape(-1), counts, displs, mpi.FLOAT], root=root)
        if not whole:
            received[:, cols] = scratch
    return received
