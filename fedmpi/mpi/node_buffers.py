"""The round's broadcast and reduction buffers in node-shared memory: each rank's round buffers are its slot
of one MPI-3 shared-memory window of its node.

With all ranks on one node (a workstation, one cluster node)

- the reduction is rank 0 adding the other slots' float64 entries into its own, in rank order, once every
  rank has arrived (MPI's Reduce would copy each rank's buffer into MPI's own shared segments and back, and
  spin on every rank while it does: W1 at -n 3 spent ~15-20 ms a round in it on each rank, its model's
  13 MB of float64 sums);
- the broadcast is rank 0's slot itself: only the node's first rank has a broadcast slot, every rank's
  broadcast buffer is that slot (read-only off its owner), and a broadcast is the barrier after which the
  others read it. No rank copies it into a slot of its own, which would cost 4 bytes per parameter more
  on every worker and a pass over the model each round.

Only buffers inside this rank's reduction slot or the node's broadcast slot take this path (`MpiComm.bcast`/
`reduce_sum` ask `span`); everything else moves through MPI as before. With ranks on several nodes each node
has its own window, and the node leaders' broadcast slots are filled by one MPI collective among the leaders
(fedmpi.mpi.hierarchy). The sums are the same sums in a fixed order (rank 0's slot, then rank 1's, ...), so a
run stays bit-for-bit reproducible at a given -n and layout.

Why it is safe without locks: every collective on this path is a barrier (each waits until every rank has
arrived). Rank 0 writes its broadcast slot only right before a broadcast, so after every rank has arrived at
the collective before it; the other ranks read the broadcast payload only between a broadcast and the next
collective (a round's training and uploads before its reduction, an evaluation before its own), never
after arriving at the collective that precedes the next broadcast. A worker writes its reduction slot only
after the next broadcast, which rank 0 sends after it has summed. `Win.Sync` (a memory barrier in MPI's
unified model) sits on both sides of each barrier.

`FEDMPI_NODE_BUFFERS=0` turns the path off (every buffer through MPI's collectives among all ranks, the
flat path), e.g. to compare the two.
"""

from __future__ import annotations

import os

import numpy as np

SWITCH = "FEDMPI_NODE_BUFFERS"
ALIGN = 64          # the broadcast part of a slot starts on a cache line
SUM_BLOCK = 1 << 15     # float64 entries the leader sums at a time (256 kB of its slot: in a core's cache)


def wanted():
    """This process would use node buffers (the environment does not turn them off)."""
    return os.environ.get(SWITCH, "1") != "0"


class NodeBuffers:
    """Every rank's slot of the round window: `up[r]` (float64, the reduction), which rank r owns, and `down`
    (float32, the broadcast), the node's first rank's, which every rank of the node reads."""

    def __init__(self, mpi, node, down_len, up_len):
        """Collective over `node` (every rank of the job, in rank order)."""
        self.MPI, self.rank = mpi, node.Get_rank()
        up_bytes = -(-up_len * 8 // ALIGN) * ALIGN
        self.win = mpi.Win.Allocate_shared(up_bytes + (down_len * 4 if self.rank == 0 else 0), 1, comm=node)
        self.win.Lock_all(mpi.MODE_NOCHECK)
        self.up = []
        for r in range(node.Get_size()):
            memory, _ = self.win.Shared_query(r)
            self.up.append(np.frombuffer(memory, dtype=np.uint8)[: up_len * 8].view(np.float64))
            if r == 0:
                self.down = np.frombuffer(memory, dtype=np.uint8)[up_bytes: up_bytes + down_len * 4].view(np.float32)
        self.up[self.rank][:] = 0.0
        if self.rank == 0:
            self.down[:] = 0.0
        self.sync_memory()

    def sync_memory(self):
        self.win.Sync()

    def span(self, buf, kind):
        """(start, stop) of `buf` (a contiguous numpy array) inside this rank's reduction slot (`kind` "up") or
        the node's broadcast slot ("down"), or None when it lies elsewhere."""
        slot = self.up[self.rank] if kind == "up" else self.down
        if buf.dtype != slot.dtype or not buf.flags.c_contiguous:
            return None
        offset = buf.__array_interface__["data"][0] - slot.__array_interface__["data"][0]
        start = offset // slot.itemsize
        if offset < 0 or offset % slot.itemsize or start + buf.size > slot.size:
            return None
        return start, start + buf.size

    def sum_into_leader(self, span):
        """The node's first rank (rank 0 on its node): adds every other rank's entries `span` of its reduction
        slot into its own, in node-rank order. Block by block, every other slot's block added while the
        leader's is in cache: one pass over the leader's slot whatever the node's size (a slot after another
        read and wrote it once per rank: 48 instead of 32 bytes moved per entry at 3 ranks), the same
        additions in the same order on every entry."""
        a, b = span
        mine = self.up[0][a:b]
        others = [other[a:b] for other in self.up[1:]]
        for i in range(0, b - a, SUM_BLOCK):
            block = mine[i:i + SUM_BLOCK]
            for other in others:
                np.add(block, other[i:i + SUM_BLOCK], out=block)

    def free(self):
        """Collective: the window goes (the slots' arrays with it)."""
        self.up, self.down = [], None
        self.win.Unlock_all()
        self.win.Free()
