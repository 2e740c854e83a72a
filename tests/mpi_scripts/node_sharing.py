"""Run under mpiexec: what each rank sees of its node, for each layout of pretend nodes asked for.

Usage: node_sharing.py CONFIG NODES:OUT_PREFIX [NODES:OUT_PREFIX ...]. For each pair (in one launch: a launch
costs more than this), with FEDMPI_TEST_NODES=NODES (NODES "-": the environment as launched, e.g. MPI's own
nodes) and a fresh communicator, writes OUT_PREFIX-<rank>.json
with this rank's NodeInfo, the CUDA device it would pick on a node with 3 GPUs (torch.cuda stubbed: no GPU is
needed), its torch threads, the rows it filled in a shared window and the window's contents as it sees them, a
broadcast and a reduction through the round's node-shared buffers,
and whether the node-shared data set of CONFIG equals the private loader's on this rank, and its host name.
Each rank binds itself to one CPU (`bound_cpu`) for the report: a node's cores are those of all its ranks.
Also runs as a step of a shared launch (tests/session_runs.py): torch.cuda is restored at the end.
"""

import json
import os
import socket
import sys

import numpy as np
import torch
from mpi4py import MPI

from fedmpi import config
from fedmpi.data import load_dataset
from fedmpi.data.shared import load_shared
from fedmpi.mpi.comm import make_comm
from fedmpi.mpi.runtime import pick_device, set_threads
from fedmpi.mpi.topology import TEST_NODES, share_of

cfg = config.load(sys.argv[1])
chosen = []
REAL_CUDA = {name: getattr(torch.cuda, name) for name in ("is_available", "device_count", "set_device")}
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 3
torch.cuda.set_device = chosen.append


CPUS = sorted(os.sched_getaffinity(0))


def bound_cpu(rank):
    """The one CPU rank `rank` binds itself to for the report, as a launcher binding tasks would
    (tests/test_nodes_mpi.py counts a node's cores from the same rule)."""
    return CPUS[rank % len(CPUS)]


def report(prefix):
    """One layout: the communicator reads FEDMPI_TEST_NODES when it first splits the ranks into nodes."""
    os.sched_setaffinity(0, {bound_cpu(MPI.COMM_WORLD.Get_rank())})
    comm = make_comm()
    node = comm.node_local()
    # Node-local device choice on a pretend node of 3 GPUs.
    chosen.clear()
    device = pick_device("cuda", node.local_rank)
    threads = set_threads(None, node.local_size, node.cores)
    written = []

    def fill(arrays, part, parts):
        a = arrays["marks"]
        lo, hi = share_of(len(a), part, parts)
        a[lo:hi] = 100 * node.node + part
        written.extend([lo, hi])

    marks = comm.share_arrays({"marks": ((12,), np.int64)} if comm.node_leader else None, fill)["marks"]
    shared = load_shared(cfg, comm)
    private = load_dataset(cfg)
    same = all(np.array_equal(getattr(shared, k), getattr(private, k))
               for k in ("x_train", "y_train", "x_test", "y_test"))
    same = same and all(np.array_equal(u, v) for u, v in zip(shared.users, private.users))
    read_only = not shared.x_train.flags.writeable
    # The round's buffers: node-shared slots, nodes joined through their leaders (fedmpi.mpi.hierarchy).
    down, up = comm.round_buffers(6, 3)
    up[:] = [comm.rank + 1, 2.0 ** -(40 + comm.rank), 1.0]
    comm.reduce_sum(up)
    if comm.rank == 0:
        down[:] = np.arange(6)
    comm.bcast(down[:4])
    round_path = {"sums": up.tolist() if comm.rank == 0 else None, "down": down.tolist(),
                  "leaders": comm._round.leaders.Get_size() if comm._round.leader else 0}
    with open(f"{prefix}-{comm.rank}.json", "w") as fh:
        json.dump({"rank": comm.rank, "local_rank": node.local_rank, "local_size": node.local_size,
                   "node": node.node, "nodes": node.nodes, "server_here": node.server_here, "cores": node.cores,
                   "threads": threads, "device": str(device), "set_device": list(chosen), "written": written,
                   "marks": marks.tolist(), "data_equal": bool(same), "read_only": read_only,
                   "host": socket.gethostname(), "processor": MPI.Get_processor_name(), **round_path}, fh)
    comm.close()


launched = os.environ.get(TEST_NODES)
try:
    for pair in sys.argv[2:]:
        nodes, prefix = pair.split(":", 1)
        if nodes != "-":
            os.environ[TEST_NODES] = nodes
        elif launched is None:
            os.environ.pop(TEST_NODES, None)
        else:
            os.environ[TEST_NODES] = launched
        report(prefix)
finally:
    os.sched_setaffinity(0, CPUS)
    for name, fn in REAL_CUDA.items():
        setattr(torch.cuda, name, fn)
