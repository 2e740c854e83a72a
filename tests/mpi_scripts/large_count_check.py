"""Run under mpiexec: MpiComm's transfers of vectors with exact patterns, checked on the receiving ranks.

Usage: large_count_check.py ELEMENTS OUT_PREFIX. ELEMENTS sets the float32 vector's length (the float64 and
uint64 ones have half as many entries, so every buffer has the same byte size); 0 means just over 2^31
bytes. Checks bcast, reduce_sum (float64), reduce_sum_mod (uint64), gather_rows (three rows in all),
masked_gather (uploads gated out in between), route and gather_states. Writes OUT_PREFIX-RANK.json with
how many calls of each mpi4py method the rank made (the slicing under FEDMPI_MPI_CHUNK_BYTES shows there)
after every check passed; an assertion failure exits non-zero and aborts the job.
"""

import gc
import json
import sys

import numpy as np
from call_counter import Recorder

from fedmpi.mpi.comm import MpiComm

BIG_BYTES = 2**31 + 4096
PRIME = 65521       # patterns i % PRIME: exact in float32 and float64, different in every slice


_TEMPLATES = {}
PERIODS = 64        # a template holds this many periods, plus one for the offset


def _template(dtype):
    if dtype not in _TEMPLATES:
        _TEMPLATES[dtype] = (np.arange((PERIODS + 1) * PRIME, dtype=np.int64) % PRIME).astype(dtype)
    return _TEMPLATES[dtype]


def _blocks(n, offset):
    """(slice of the vector, slice of the template) covering range(n) for the pattern at `offset`."""
    start, step = offset % PRIME, PERIODS * PRIME
    for a in range(0, n, step):
        m = min(n, a + step) - a
        yield slice(a, a + m), slice(start, start + m)


def pattern(n, dtype, offset=0, out=None):
    """(offset + i) % PRIME for i < n (into `out` where given), copied from a template (no temporaries)."""
    out = np.empty(n, dtype=dtype) if out is None else out
    t = _template(np.dtype(dtype))
    for vec, tpl in _blocks(n, offset):
        out[vec] = t[tpl]
    return out


def equal(a, offset, scale=1, shift=0):
    """a == scale * pattern(len(a), offset) + shift, compared block by block."""
    t = _template(a.dtype)
    return all(np.array_equal(a[vec], t[tpl] * a.dtype.type(scale) + a.dtype.type(shift))
               for vec, tpl in _blocks(len(a), offset))


def main():
    elements = int(sys.argv[1]) or BIG_BYTES // 4
    comm = MpiComm()
    recorder = Recorder(comm.comm)
    comm.comm = recorder
    rank, size = comm.rank, comm.size

    # One arena per rank for the broadcast and the reductions (each touches its pages once).
    arena = np.zeros(elements * 4, dtype=np.uint8)

    # bcast: rank 0's pattern everywhere.
    buf = arena.view(np.float32)
    if rank == 0:
        pattern(elements, np.float32, out=buf)
    comm.bcast(buf)
    assert equal(buf, 0), f"bcast differs on rank {rank}"
    # The same bytes as uint8: a count over 2^31 - 1 when big (MPI-4's MPI_Bcast_c, or slices).
    if rank != 0:
        buf[:] = 0
    comm.bcast(arena)
    assert equal(buf, 0), f"bcast of uint8 differs on rank {rank}"

    # reduce_sum (float64, as the round's sums): rank r contributes (r + 1) * pattern.
    half = elements // 2
    buf = pattern(half, np.float64, out=arena.view(np.float64)[:half])
    buf *= rank + 1
    comm.reduce_sum(buf)
    if rank == 0:
        assert equal(buf, 0, scale=size * (size + 1) // 2), "reduce_sum differs"

    # reduce_sum_mod (secure aggregation's uint64 field sums, 2^bits wrap): every rank adds 2^63 + pattern.
    buf = pattern(half, np.uint64, out=arena.view(np.uint64)[:half])
    buf += np.uint64(1 << 63)
    got = comm.reduce_sum_mod(buf, 64)
    if rank == 0:
        assert equal(got, 0, scale=size, shift=(size * (1 << 63)) % (1 << 64)), "reduce_sum_mod differs"
    del buf, got, arena
    gc.collect()

    # gather_rows: three rows in all, rank r's rows (r, k) patterned at offset 1000 r + k.
    rows_by_rank = [1, 2] + [0] * (size - 2) if size >= 2 else [3]
    width = elements // 3
    block = np.stack([pattern(width, np.float32, 1000 * rank + k) for k in range(rows_by_rank[rank])]) \
        if rows_by_rank[rank] else np.zeros((0, width), dtype=np.float32)
    got = comm.gather_rows(block, rows_by_rank, width)
    if rank == 0:
        expect = [(r, k) for r in range(size) for k in range(rows_by_rank[r])]
        assert got.shape == (3, width)
        for row, (r, k) in zip(got, expect):
            assert equal(row, 1000 * r + k), f"gather_rows: row of rank {r} differs"
    del block, got
    gc.collect()

    if int(sys.argv[1]):        # small vectors: the other transfers too (their slicing is the same code)
        small_checks(comm, rank, size, elements)

    comm.comm = recorder.inner
    with open(f"{sys.argv[2]}-{rank}.json", "w") as fh:
        json.dump(dict(recorder.calls), fh)
    comm.close()


def small_checks(comm, rank, size, dim):
    # masked_gather: every worker hosts two selected clients (ids 10 r, 10 r + 1); the second is gated out.
    hosted = {r: [10 * r, 10 * r + 1] for r in range(1, size)}
    mine = hosted.get(rank, [])
    mask = np.array([1, 0][: len(mine)], dtype=np.int8)
    vectors = [pattern(dim, np.float32, c) for c, m in zip(mine, mask) if m]
    out = comm.masked_gather(mask, vectors, hosted, dim)
    if rank == 0:
        assert sorted(out) == [10 * r for r in range(1, size)], sorted(out)
        assert all(equal(v, c) for c, v in out.items()), "masked_gather differs"

    # route: each worker sends its pattern to the next worker (a ring) under the key of its rank.
    workers = list(range(1, size))
    if rank in workers and len(workers) > 1:
        nxt, prev = workers[(workers.index(rank) + 1) % len(workers)], workers[workers.index(rank) - 1]
        got = np.zeros(dim, dtype=np.float32)
        comm.route([(nxt, rank, pattern(dim, np.float32, rank))], [(prev, prev, got)])
        assert equal(got, prev), f"route differs on rank {rank}"
    elif rank == 0:
        comm.route([], [])

    # gather_states: client c on rank 1 + c % (size - 1), a float32 vector and an int64 one.
    host = np.array([1 + c % (size - 1) for c in range(4)])
    got = {}
    comm.gather_states(host, lambda c: {"v": pattern(dim, np.float32, c), "n": np.arange(c + 1)},
                       lambda c, s: got.__setitem__(c, s))
    if rank == 0:
        assert sorted(got) == [0, 1, 2, 3]
        for c, s in got.items():
            assert equal(s["v"], c) and np.array_equal(s["n"], np.arange(c + 1)), f"state {c} differs"


if __name__ == "__main__":
    main()
