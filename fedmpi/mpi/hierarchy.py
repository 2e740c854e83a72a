"""The hierarchical round: the round's broadcast and reduction through each node's shared memory and one MPI
collective among the node leaders, on any number of nodes.

Every node has its own round window (fedmpi.mpi.node_buffers.NodeBuffers over the node's communicator);
its first rank is the node's leader, and rank 0 is the leader of its node (MPI's shared split keys ranks by
their world rank). The leaders' communicator holds one rank per node, in world-rank order, so rank 0 is its
root too. Then, once every rank has arrived (the caller's sleeping barrier and memory barriers):

- reduction: each leader adds its node's other slots into its own, in node-rank order (float64), and the
  leaders sum those node totals by one MPI Reduce into rank 0's slot;
- broadcast: the leaders receive rank 0's slot by one MPI Bcast into their own broadcast slot, which is the
  broadcast buffer of every rank of their node (fedmpi.mpi.node_buffers); the node's other ranks read it
  after a node barrier where the leader is not rank 0, whose slot was filled before anyone arrived.

So one MPI collective per transfer among the leaders, where the flat path has one among all ranks; with one
node the leaders' communicator is rank 0 alone and no MPI transfer happens at all (the one-node path of
before). The sums are the same float64 sums in another order (node totals, then MPI's order over the
nodes), exactly as -n 1 against -n 3 are: the float32 model is the same in every test fedmpi has
(docs/explanation/design.md, "How -n invariance and resume are kept"), not the same float64 bits by construction.

Why the slots need no locks: as on one node (node_buffers), a leader writes its broadcast slot only inside
a broadcast that every rank of its node has arrived at, i.e. after they last read the previous one; it sums
into its own reduction slot only after every rank wrote its own, and no rank reads a reduction slot after
the reduction (each clears its slot for the next round's tally).
"""

from __future__ import annotations

from fedmpi.mpi import large_count
from fedmpi.mpi.node_buffers import NodeBuffers


class NodeRound:
    """A node's round window and the leaders' communicator (MPI.COMM_NULL off the leaders)."""

    def __init__(self, mpi, world, node, down_len, up_len):
        """Collective over `world` (the leaders' split) and `node` (the window)."""
        self.MPI = mpi
        self.world_rank = world.Get_rank()
        self.buffers = NodeBuffers(mpi, node, down_len, up_len)
        self.node = node
        self.leader = node.Get_rank() == 0
        self.leaders = world.Split(0 if self.leader else mpi.UNDEFINED, key=self.world_rank)
        self.between_nodes = self.leader and self.leaders.Get_size() > 1    # a leader of one of several nodes
        # Rank 0's node copies straight from rank 0's slot; other nodes wait for their leader's receive.
        self.server_node = bool(node.allreduce(int(self.world_rank == 0), op=mpi.MAX))

    def span(self, buf, kind):
        return self.buffers.span(buf, kind)

    def sync_memory(self):
        self.buffers.sync_memory()

    def reduce(self, span):
        """After every rank arrived: the node's sums into the leader's slot, then the leaders' MPI Reduce into
        rank 0's. Ranks other than the leaders return at once."""
        if not self.leader:
            return
        self.buffers.sum_into_leader(span)
        if not self.between_nodes:
            return
        a, b = span
        mine = self.buffers.up[0][a:b]
        large_count.reduce_sum(self.leaders, self.MPI, mine, self.world_rank == 0)

    def bcast_leaders(self, buf):
        """After every rank arrived, on the leaders: rank 0's `buf` (in its broadcast slot) into each leader's
        `buf` (its own slot: the node's copy) by one MPI Bcast among the leaders."""
        if self.between_nodes:
            large_count.bcast(self.leaders, self.MPI, buf, root=0)

    def await_leader(self, wait):
        """Off rank 0's node: the node's ranks wait (`wait(request)`, the communicator's sleeping wait) until
        their leader has received; rank 0's node needs no wait (rank 0 filled its slot before arriving)."""
        if self.server_node:
            return
        if self.leader:
            self.buffers.sync_memory()
        wait(self.node.Ibarrier())
        if not self.leader:
            self.buffers.sync_memory()

    def free(self):
        """Collective: the window and the leaders' communicator go."""
        self.buffers.free()
        if self.leaders != self.MPI.COMM_NULL:
            self.leaders.Free()
