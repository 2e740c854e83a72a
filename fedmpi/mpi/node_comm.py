"""The collectives among the ranks of one node, which `MpiComm` (fedmpi.mpi.comm) inherits: the node's
communicator (MPI's shared-memory split, or pretend nodes under FEDMPI_TEST_NODES), where a rank sits on
its node and how many cores the node has (`node_local`), and arrays shared by the node's ranks in one MPI-3
window (`share_arrays`). They are set-up's concerns and touch only the node's communicator; the job-wide
round path, the failure reports and the checkpoints' transfers stay in fedmpi.mpi.comm.

The methods rely on what `MpiComm` provides: `MPI`, `comm`, `rank`, `size`, `_node`, `_windows`,
`_sleep_wait`, `sync` and `_whole` (for `arrive_first`).
"""

from __future__ import annotations

import numpy as np

from fedmpi.mpi.base import FAILURE_BYTES, arrive_first, error_text, exit_code_of
from fedmpi.mpi.runtime import usable_cpus
from fedmpi.mpi.shared_arrays import PeerFailed, read_only, shared_layout, views
from fedmpi.mpi.state_codec import STATE_META, decode_state_meta, encode_specs
from fedmpi.mpi.topology import NodeInfo, node_count, pretend_node

CPU_IDS = 8192            # node_local: the CPU ids a node's ranks may run on, one mask (CPU_SETSIZE: 1024)


class NodeCollectives:
    """The node-level half of `MpiComm` (a mixin: it keeps no state of its own beyond MpiComm's `_node` and
    `_windows`, which `MpiComm.close` frees)."""

    def _node_comm(self):
        """The ranks sharing this rank's node (memory), made once: MPI's COMM_TYPE_SHARED split, further split
        into contiguous blocks of ranks under FEDMPI_TEST_NODES."""
        if self._node is None:
            local = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
            nodes = node_count(self.size)
            if nodes > 1:
                pretend = local.Split(pretend_node(self.rank, self.size, nodes), key=self.rank)
                local.Free()
                local = pretend
            self._node = local
        return self._node

    @property
    def node_leader(self):
        """This rank is the first of its node (collective the first time: see `_node_comm`)."""
        return self._node_comm().Get_rank() == 0

    @arrive_first
    def node_local(self, gpus=0):
        """Collective: this rank's NodeInfo (its place on its node, its node's cores, and rank 0's node: ranks,
        cores and the `gpus` rank 0 counted there)."""
        local = self._node_comm()
        lowest = np.zeros(1, dtype=np.int64)
        local.Allreduce(np.array([self.rank], dtype=np.int64), lowest, op=self.MPI.MIN)
        leaders = np.zeros(self.size, dtype=np.int64)
        self.comm.Allgather(np.array([int(local.Get_rank() == 0)], dtype=np.int64), leaders)
        # The node's cores: those any of its ranks may run on (a launcher that binds each task to its own
        # cores, as srun may, still gives the node's ranks their share of the node). Pretend nodes share
        # their machine's cores in proportion to their ranks.
        machine = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        seen = np.zeros(CPU_IDS, dtype=np.uint8)
        seen[[c for c in usable_cpus() if c < CPU_IDS]] = 1
        machine.Allreduce(self.MPI.IN_PLACE, seen, op=self.MPI.MAX)
        cores = max(1, int(seen.sum()) * local.Get_size() // machine.Get_size())
        machine.Free()
        server_node = np.array([local.Get_size(), cores, gpus], dtype=np.int64)
        self.comm.Bcast(server_node, root=0)
        return NodeInfo(local.Get_rank(), local.Get_size(), bool(lowest[0] == 0), *map(int, server_node), cores,
                        int(leaders[: lowest[0]].sum()), int(leaders.sum()))

    def share_arrays(self, specs, fill):
        """Collective over the node: one copy of the arrays `specs` describes ({name: (shape, dtype)}, as the
        node's first rank gives it; ignored elsewhere) for all the node's ranks, in an MPI-3 shared-memory
        window. Every rank of the node calls `fill(arrays, part, parts)` with the writable arrays, `part` its
        node-local rank of `parts`: each fills its share (e.g. `share_of` the rows), so each first-touches,
        and is charged for, only that share. Returns the arrays, read-only, on every rank of the node; they
        live until `close`.

        The first rank passes an exception instead of `specs` when it could not make them: it re-raises it
        and the node's other ranks raise PeerFailed with its exit code; so does a failure inside `fill` on
        any rank. Waits sleep, as elsewhere (loading may take minutes on one rank while the others wait)."""
        node = self._node_comm()
        part, parts = node.Get_rank(), node.Get_size()
        header = np.zeros(3, dtype=np.int64)            # [exit code, spec rows, name bytes]
        if part == 0:
            if isinstance(specs, BaseException):
                header[0] = exit_code_of(specs)
            else:
                meta, names = encode_specs(specs)
                header[1:] = len(meta), len(names)
        self._sleep_wait(node.Ibcast(header, root=0))
        if header[0]:
            text = self._node_text(error_text(specs) if part == 0 else "", 0)
            if part == 0:
                raise specs
            raise PeerFailed(int(header[0]), 0, text)
        if part != 0:
            meta = np.zeros((header[1], STATE_META), dtype=np.int64)
            names = np.zeros(header[2], dtype=np.uint8)
        node.Bcast(meta, root=0)
        node.Bcast(names, root=0)
        specs = {name: (shape, dtype) for name, dtype, shape in decode_state_meta(meta, names)}
        layout, total = shared_layout(specs)
        win = self.MPI.Win.Allocate_shared(total if part == 0 else 0, 1, comm=node)
        buffer, _ = win.Shared_query(0)
        arrays = views(buffer, layout)
        error, code = None, 0
        try:
            fill(arrays, part, parts)
        except Exception as e:  # noqa: BLE001 - every rank of the node must reach the agreement below
            error, code = e, exit_code_of(e)
        value = np.array([code * (parts + 1) + (parts - part) if code else 0], dtype=np.int64)
        worst = np.zeros(1, dtype=np.int64)
        self._sleep_wait(node.Iallreduce(value, worst, op=self.MPI.MAX))
        if worst[0]:
            del arrays, buffer
            win.Free()
            speaker = int(parts - worst[0] % (parts + 1))
            text = self._node_text(error_text(error) if part == speaker else "", speaker)
            if error is not None:
                raise error
            raise PeerFailed(int(worst[0] // (parts + 1)), speaker, text)
        self._windows.append(win)
        return read_only(arrays)

    def _node_text(self, text, root):
        """Node-local rank `root`'s `text` (at most FAILURE_BYTES) to every rank of the node."""
        buf = bytearray(FAILURE_BYTES)
        data = text.encode()[: FAILURE_BYTES - 1]
        buf[: len(data)] = data
        self._node_comm().Bcast([buf, self.MPI.BYTE], root=root)
        return bytes(buf).rstrip(b"\0").decode(errors="replace")
