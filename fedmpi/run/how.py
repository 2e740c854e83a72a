"""How a run ran, for its run file: the nodes and the ranks on each, every rank's host name, device and threads,
the path of the round's reduction and broadcast, the MPI library, and the value each `auto` (or null) setting
resolved to on this machine. Collected once at set-up by one gather to rank 0 (`how_it_ran`); written into
run.h5's root attributes beside the library versions (docs/how-to/analysis.md lists them)."""

from __future__ import annotations

import socket
import sys

import numpy as np
import yaml

from fedmpi.core import cpu_kernels
from fedmpi.run.progress import _isatty

HOST_BYTES, DEVICE_BYTES = 64, 32
FIXED = 4                       # node, node-local rank, threads, trains clients
WIDTH = FIXED + HOST_BYTES + DEVICE_BYTES


def _text_row(text, width):
    raw = text.encode("utf-8", errors="replace")[:width]
    return np.frombuffer(raw.ljust(width, b"\0"), dtype=np.uint8).astype(np.float32)


def _text(row):
    return bytes(np.asarray(row, dtype=np.uint8)).rstrip(b"\0").decode("utf-8", errors="replace")


def host_name(comm):
    mpi = getattr(comm, "MPI", None)
    return mpi.Get_processor_name() if mpi is not None else socket.gethostname()


def mpi_library(comm):
    """(the MPI library's first line, the MPI standard version) or ('none (one process)', '')."""
    mpi = getattr(comm, "MPI", None)
    if mpi is None:
        return "none (one process, no MPI)", ""
    lines = mpi.Get_library_version().strip().splitlines()
    return (lines[0].strip() if lines else "?"), ".".join(map(str, mpi.Get_version()))


def round_path(exp):
    """How the round's broadcast and reduction move (fedmpi.mpi.hierarchy, node_buffers)."""
    nodes = exp.node.nodes
    if not exp.wire.node_shared:
        return "flat: MPI collectives among all ranks"
    if nodes > 1:
        return f"hierarchical: node-shared memory within each node, MPI among the {nodes} node leaders"
    return "node-shared memory (one node)"


def how_it_ran(cfg, comm, exp):
    """Collective: {run.h5 attribute: value} on rank 0 (None elsewhere)."""
    mine = np.concatenate([
        np.array([exp.node.node, exp.node.local_rank, exp.threads, comm.rank in exp.workers], dtype=np.float32),
        _text_row(host_name(comm), HOST_BYTES), _text_row(str(exp.device), DEVICE_BYTES)])
    before = comm.timer.seconds.copy()         # the gather is set-up, not the first round's reduction time
    rows = comm.gather_rows(mine[None, :], [1] * comm.size, WIDTH)
    comm.timer.seconds = before
    if not comm.is_server:
        return None
    nodes = [int(r[0]) for r in rows]
    hosts = [_text(r[FIXED:FIXED + HOST_BYTES]) for r in rows]
    per_node = [nodes.count(k) for k in range(max(nodes) + 1)]
    library, standard = mpi_library(comm)
    resolved = {
        "runtime.device": sorted({_text(r[FIXED + HOST_BYTES:]) for r in rows}),
        "runtime.threads": sorted({int(r[2]) for r in rows}),
        "runtime.progress": cfg.runtime.progress if cfg.runtime.progress != "auto" else
        ("bar" if _isatty(sys.stderr) else "lines"),
        "runtime.kernels": "fast" if cpu_kernels.wanted(cfg.runtime.kernels, cfg.model.name, exp.device) else "plain",
        "runtime.client_dealing": "as workers become free" if exp.clients.tickets is not None else "static shares",
        "client.vectorize": "on" if exp.clients.batched else "off",
        "server.trains_clients": bool(rows[0][3]),
    }
    return {"nodes": len(per_node), "ranks_per_node": ",".join(map(str, per_node)),
            "hosts": ",".join(sorted(set(hosts))), "rank_hosts": ",".join(hosts),
            "rank_nodes": ",".join(map(str, nodes)),
            "devices": ",".join(_text(r[FIXED + HOST_BYTES:]) for r in rows),
            "rank_threads": ",".join(str(int(r[2])) for r in rows),
            "round_path": round_path(exp), "mpi_library": library, "mpi_version": standard,
            "resolved": yaml.safe_dump(resolved, sort_keys=False, default_flow_style=False)}
