"""Which node a rank is on and what the node has: `node_local`'s answer (`NodeInfo`), the pretend nodes of
`FEDMPI_TEST_NODES=K` (a test aid that splits the ranks into K nodes on one machine, so that node-local
device choice, threads and data sharing can be exercised) and a rank's share of a node's rows."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fedmpi.core.errors import ConfigError

TEST_NODES = "FEDMPI_TEST_NODES"


def node_count(size):
    """Pretend nodes asked for by FEDMPI_TEST_NODES (1 when unset), at most one per rank."""
    text = os.environ.get(TEST_NODES, "").strip()
    if not text:
        return 1
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{TEST_NODES} = {text!r}: must be a positive integer (pretend nodes, a test aid)")
    return min(int(text), size)


def pretend_node(rank, size, nodes):
    """The pretend node of `rank` when `size` ranks are split into `nodes` contiguous blocks (as a launcher
    that fills one node after another places them)."""
    return rank * nodes // size


def share_of(n, part, parts):
    """Rows [lo, hi) of `n` that part `part` of `parts` fills (contiguous, sizes within one of each other)."""
    return n * part // parts, n * (part + 1) // parts


@dataclass(frozen=True)
class NodeInfo:
    local_rank: int             # this rank's index among the ranks on its node
    local_size: int             # ranks on this node
    server_here: bool           # rank 0 is on this node
    server_node_ranks: int      # ranks on rank 0's node
    server_node_cores: int      # cores usable on rank 0's node
    server_node_gpus: int = 0   # GPUs rank 0 would train on (0 on a CPU node)
    cores: int = 0              # cores usable on this rank's node (0: unknown)
    node: int = 0               # this rank's node, 0..nodes-1 (pretend nodes under FEDMPI_TEST_NODES)
    nodes: int = 1

    def server_spare_core(self):
        """Rank 0's node is a CPU node with a core beyond those of its other ranks, idle while they train (on
        a GPU node rank 0 would share a GPU with a worker instead)."""
        return self.server_node_gpus == 0 and self.server_node_cores > self.server_node_ranks - 1
