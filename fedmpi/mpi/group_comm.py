"""The communicators of one experiment inside a sweep (fedmpi.sweep): `GroupComm`, an MpiComm on the
sub-communicator of the experiment's group of ranks whose failure ends that group's experiment instead of the
MPI job, and `GroupLocal`, the LocalComm of a group of one rank. Both take their node's cores and device
numbering from the sweep (`HostShare`): the groups on one node share its cores, and its GPUs by the sweep's
node-local rank.

Failure in a group (docs/how-to/sweeps.md). fedmpi.run.launch's failure contract ends the job with MPI_Abort, which
ends every process of the launch (MPICH's MPI_Abort on a sub-communicator too). A GroupComm's `abort` instead
sends every other rank of the group a notice (exit code, rank) and returns; launch's `_fail` then ends the
experiment on this rank with SystemExit(code), which the sweep catches. The group's other ranks are waiting
in `_sleep_wait` (every wait of set-up and of the round polls rather than blocks: fedmpi.mpi.comm), which
checks for the notice and raises GroupAborted; their `_fail` finds the group ended and ends the same way
without reporting again. A worker that fails reports to rank 0 as usual and waits for rank 0's notice (at
most FAILURE_GRACE_S, after which it sends the notice itself). The communicator is then abandoned, not freed:
collectives that the failing rank never entered cannot complete (MPI cannot cancel a collective), and freeing
is itself collective. What it held (the round buffers' window) stays allocated until the launch ends;
MPI_Finalize completes with such requests pending (MPICH 5); this module cancels its own receives.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from fedmpi.core.errors import FedmpiError
from fedmpi.mpi.base import FAILURE_BYTES, ROUND_MARK
from fedmpi.mpi.comm import FAILURE_GRACE_S, FAILURE_TAG, MpiComm
from fedmpi.mpi.local import LocalComm
from fedmpi.mpi.topology import NodeInfo

NOTICE_TAG = 79       # a group's failure notice: [exit code, rank]


@dataclasses.dataclass(frozen=True)
class HostShare:
    """This rank's node as the sweep sees it: the node's cores, the sweep's ranks that compute there (its
    ranks on the node but the dispatcher), and this rank's index among the sweep's ranks on the node."""

    cores: int
    computing: int
    device_rank: int

    def cores_for(self, ranks_here):
        """The cores of this node that a group with `ranks_here` ranks on it may use: its share."""
        return max(1, self.cores * ranks_here // max(1, self.computing))


class GroupAborted(FedmpiError):
    """Raised in a wait of a group's rank once another rank of the group ended the experiment by a failure."""

    def __init__(self, code, rank):
        super().__init__(f"rank {rank} of this experiment's group ended it (exit {code})")
        self.exit_code = code


class GroupComm(MpiComm):
    def __init__(self, mpi_comm, host: HostShare):
        super().__init__(mpi_comm)
        self.host = host
        self.ended = None           # (exit code, rank) once a failure ended the group's experiment
        self._notice = np.zeros(2, dtype=np.int64)
        self._notice_req = self.comm.Irecv([self._notice, self.MPI.INT64_T], source=self.MPI.ANY_SOURCE,
                                           tag=NOTICE_TAG)
        self._sent = []             # the notices and the failure report in flight (kept alive until the end)
        self._closed = False

    def _noticed(self):
        if self.ended is None and self._notice_req is not None and self._notice_req.Test():
            self.ended = (int(self._notice[0]), int(self._notice[1]))
            self._notice_req = None
        return self.ended

    def _check_failures(self, request):
        super()._check_failures(request)        # rank 0: a worker's report raises WorkerFailed first
        ended = self._noticed()
        if ended is not None and ended[1] != self.rank and not request.Test():
            raise GroupAborted(*ended)

    def report_failure(self, text):
        """Worker side: tells rank 0 why this rank fails and waits for rank 0's notice (see the docstring)."""
        if self.rank == 0 or self._noticed() is not None:
            return
        if self.round is not None:
            text = f"{ROUND_MARK}{self.round}\n{text}"
        data = text.encode()[: FAILURE_BYTES - 1]
        self._sent.append((data, self.comm.Issend([data, self.MPI.BYTE], dest=0, tag=FAILURE_TAG)))
        deadline = time.monotonic() + FAILURE_GRACE_S
        while self._noticed() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def abort(self, code):
        """Ends the experiment on the group only: the notice to every other rank (see the docstring)."""
        if self._noticed() is None:
            self.ended = (int(code), self.rank)
            note = np.array([code, self.rank], dtype=np.int64)
            for r in range(self.size):
                if r != self.rank:
                    self._sent.append((note, self.comm.Isend([note, self.MPI.INT64_T], dest=r, tag=NOTICE_TAG)))
        self._abandon()

    def _abandon(self):
        for req in (self._notice_req, self._failure_req if self._failure is None else None):
            if req is not None:
                req.Cancel()
                req.Wait()
        self._notice_req = self._failure_req = None
        self._closed = True

    def close(self):
        """Collective, as MpiComm.close, then the sub-communicator itself is freed (once; never after a
        failure ended the group: see the docstring)."""
        if self._closed:
            return
        self._closed = True
        if self._notice_req is not None:
            self._notice_req.Cancel()
            self._notice_req.Wait()
            self._notice_req = None
        super().close()
        self.comm.Free()

    def node_local(self, gpus=0):
        """MpiComm.node_local with the sweep's view of the node: this group's share of its cores and the device
        numbering of the sweep's ranks (rank 0's share goes to every rank, as the node's cores do)."""
        info = super().node_local(gpus)
        cores = np.array([self.host.cores_for(info.local_size)], dtype=np.int64)
        server_cores = cores.copy()
        self.comm.Bcast(server_cores, root=0)
        return dataclasses.replace(info, local_rank=self.host.device_rank, cores=int(cores[0]),
                                   server_node_cores=int(server_cores[0]))


class GroupLocal(LocalComm):
    """LocalComm for a group of one rank: `fedmpi run` at -n 1, on the node's share of the sweep's cores."""

    def __init__(self, host: HostShare):
        super().__init__()
        self.host = host

    def node_local(self, gpus=0):
        cores = self.host.cores_for(1)
        return NodeInfo(self.host.device_rank, 1, True, 1, cores, gpus, cores)
