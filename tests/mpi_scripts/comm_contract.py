"""One body of checks for every communicator (`fedmpi.mpi.base.Comm`): imported by tests/test_comm_contract.py
for `LocalComm` in process, and run as a script under mpiexec (-n 1 and -n 3) for `MpiComm`.

Usage: comm_contract.py OUT_PREFIX. Each rank writes OUT_PREFIX-<rank>.json: {"ok": true} or the failure.
"""

import json
import sys
import traceback

import numpy as np

from fedmpi.mpi.base import Comm
from fedmpi.mpi.topology import share_of


def exercise(comm):
    """The contract's collectives on `comm`, with the results every rank must see for `comm.size` ranks."""
    rank, size = comm.rank, comm.size
    assert isinstance(comm, Comm), type(comm)
    assert comm.is_server == (rank == 0) and set(comm.workers) <= set(range(size))

    buf = np.full(3, 7.0 if rank == 0 else -1.0, dtype=np.float32)
    assert np.array_equal(comm.bcast(buf), np.full(3, 7.0, dtype=np.float32))

    sums = comm.reduce_sum(np.full(2, rank + 1.0, dtype=np.float64))
    if rank == 0:
        assert np.array_equal(sums, np.full(2, size * (size + 1) / 2))

    # The worst exit code and the lowest rank holding it.
    assert comm.agree(2 if rank == size - 1 else 0) == (2, size - 1)

    # Clients 0..5 on ranks c % size; those with an even id upload a vector full of their id.
    dim, clients = 4, range(6)
    by_rank = {r: [c for c in clients if c % size == r] for r in range(size)}
    mine = by_rank[rank]
    mask = np.array([c % 2 == 0 for c in mine], dtype=np.int8)
    vectors = [np.full(dim, c, dtype=np.float32) for c in mine if c % 2 == 0]
    gathered = comm.masked_gather(mask, vectors, by_rank, dim)
    if rank == 0:
        assert sorted(gathered) == [0, 2, 4]
        assert all(np.array_equal(v, np.full(dim, c, dtype=np.float32)) for c, v in gathered.items())

    # One chunk of an update matrix: client c's row is [c, c + 0.5, ...] over columns 2..4 of it.
    rows_by_rank = [len(by_rank[r]) for r in range(size)]
    block = np.array([[c + 0.5 * j for j in range(2, 5)] for c in mine], dtype=np.float32).reshape(len(mine), 3)
    rows = comm.gather_rows(block, rows_by_rank, 3)
    if rank == 0:
        order = [c for r in range(size) for c in by_rank[r]]
        assert rows.shape == (6, 3) and rows.dtype == np.float32
        assert np.array_equal(rows, np.array([[c + 0.5 * j for j in range(2, 5)] for c in order], dtype=np.float32))
    else:
        assert rows is None

    host = np.array([c % size for c in clients])
    seen = []
    comm.gather_states(host, lambda c: {"v": np.arange(c, dtype=np.float64)},
                       lambda c, s: seen.append((c, s["v"].tolist() if "v" in s else [])))
    if rank == 0:
        assert seen == [(c, list(map(float, range(c)))) for c in clients], seen

    node = comm.node_local()
    assert 0 <= node.local_rank < node.local_size

    def fill(arrays, part, parts):
        lo, hi = share_of(10, part, parts)
        arrays["a"][lo:hi] = np.arange(lo, hi)

    shared = comm.share_arrays({"a": ((10,), np.int32)}, fill)
    assert np.array_equal(shared["a"], np.arange(10)) and not shared["a"].flags.writeable
    comm.sync()


if __name__ == "__main__":
    from fedmpi.mpi.comm import MpiComm

    comm = MpiComm()     # also at -n 1, where make_comm would give LocalComm
    try:
        exercise(comm)
        result = {"ok": True, "type": type(comm).__name__, "size": comm.size}
    except Exception:  # noqa: BLE001 - written for the test to show
        result = {"ok": False, "error": traceback.format_exc()}
    with open(f"{sys.argv[1]}-{comm.rank}.json", "w") as f:
        json.dump(result, f)
    comm.close()
