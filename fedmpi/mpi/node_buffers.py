"""The round's broadcast and reduction buffers in node-shared memory: each rank's round buffers are its slot
of one MPI-3 shared-memory window of its node.

With all ranks on one node (a workstation, one cluster node)

- the reduction is rank 0 adding the other slots' float64 entries into its own, in rank order, once every
  rank has arrived (MPI's Reduce would copy each rank's buffer into MPI's own shared segments and back, and
  spin on every rank while it does: W1 at -n 3 spent ~15-20 ms a round in it on each rank, its model's
  13 MB of float64 sums);
- the broadcast is each other rank copying rank 0's slot into its own once every rank has arrived.

Only buffers inside this rank's slot take this path (`MpiComm.bcast`/`reduce_sum` ask `span`); everything
else moves through MPI as before. With ranks on several nodes each node has its own window, and the node
leaders' slots travel by one MPI collective among the leaders (fedmpi.mpi.hierarchy). The sums are the same
sums in a fixed order (rank 0's slot, then rank 1's, ...), so a run stays bit-for-bit reproducible at a given
-n and layout.

Why it is safe without locks: rank 0 writes its slot only between collectives that every rank has passed
after reading it (the next round's broadcast is filled after this round's reduction), and a worker writes
its reduction slot only after the next broadcast, which rank 0 sends after it has summed. `Win.Sync`
(a memory barrier in MPI's unified model) sits on both sides of each barrier.

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
    """Every rank's slot of the round window: `up[r]` (float64, the reduction) and `down[r]` (float32, the
    broadcast); `rank` owns `up[rank]` and `down[rank]`."""

    def __init__(self, mpi, node, down_len, up_len):
        """Collective over `node` (every rank of the job, in rank order)."""
        self.MPI, self.rank = mpi, node.Get_rank()
        up_bytes = -(-up_len * 8 // ALIGN) * ALIGN
        self.win = mpi.Win.Allocate_shared(up_bytes + down_len * 4, 1, comm=node)
        self.win.Lock_all(mpi.MODE_NOCHECK)
        self.up, self.down = [], []
        for r in range(node.Get_size()):
            memory, _ = self.win.Shared_query(r)
            raw = np.frombuffer(memory, dtype=np.uint8)
            self.up.append(raw[: up_len * 8].view(np.float64))
            self.down.append(raw[up_bytes: up_bytes + down_len * 4].view(np.float32))
        self.up[self.rank][:] = 0.0
        self.down[self.rank][:] = 0.0
        self.sync_memory()

    def sync_memory(self):
        self.win.Sync()

    def span(self, buf, kind):
        """(start, stop) of `buf` (a contiguous numpy array) inside this rank's `kind` slot ("up" or "down"),
        or None when it lies elsewhere."""
        slot = (self.up if kind == "up" else self.down)[self.rank]
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

    def copy_from_leader(self, buf, span):
        """A rank other than the node's first: the first rank's broadcast entries `span` into `buf`."""
        a, b = span
        np.copyto(buf, self.down[0][a:b])

    def free(self):
        """Collective: the window goes (the slots' arrays with it)."""
        self.up = self.down = []
        self.win.Unlock_all()
        self.win.Free()
