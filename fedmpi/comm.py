"""Communication between the server (rank 0) and the workers (ranks >= 1).

The only module that imports mpi4py. `MpiComm` moves flat numpy float32 buffers with buffer-based
(uppercase) calls; `LocalComm` is its single-process twin with the same methods, so every algorithm runs
unchanged at `-n 1`.

Waiting: a rank that waits for others (the server while workers train, a worker while the server
evaluates) must not burn a core that a training rank needs. Each phase therefore starts with a tiny
non-blocking collective polled with sleeps (`_sleep_wait`); once everyone has arrived, the large buffer
moves with a blocking call at full speed.
"""

from __future__ import annotations

import os
import time

import numpy as np

FAILURE_TAG = 77
FAILURE_BYTES = 8192
# How long a failing worker waits for the server to record its error before aborting the job itself.
FAILURE_GRACE_S = 10.0


class WorkerFailed(Exception):
    """Raised on the server when a worker reports an exception; the job is then aborted."""

    def __init__(self, rank, text):
        self.rank, self.text = rank, text
        super().__init__(f"rank {rank}: {text}")


class LocalComm:
    """Everything in one process: rank 0 is server and the only worker."""

    rank = 0
    size = 1
    workers = (0,)

    @property
    def is_server(self):
        return True

    def bcast(self, buf):
        return buf

    def reduce_sum(self, buf):
        return buf

    def sync(self):
        pass

    def any_flag(self, flag: bool) -> bool:
        return flag

    def report_failure(self, text):
        pass

    def node_local(self):
        return 0, 1, True

    def abort(self, code):
        os._exit(code)

    def close(self):
        pass


class MpiComm:
    """Rank 0 is the server and hosts no clients; ranks 1..P-1 are workers."""

    def __init__(self, mpi_comm=None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = mpi_comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.workers = tuple(range(1, self.size))
        self._header = np.zeros(4, dtype=np.float64)
        self._failure_buf = bytearray(FAILURE_BYTES)
        self._failure_req = (self.comm.Irecv([self._failure_buf, MPI.BYTE], source=MPI.ANY_SOURCE,
                                             tag=FAILURE_TAG) if self.rank == 0 else None)
        self._status = MPI.Status()

    @property
    def is_server(self):
        return self.rank == 0

    # -- waiting -------------------------------------------------------------------------------
    def _sleep_wait(self, request):
        """Polls `request` with growing sleeps (10 us .. 2 ms); the server also watches for failures."""
        delay = 1e-5
        while not request.Test():
            self._check_failures()
            time.sleep(delay)
            delay = min(delay * 1.5, 2e-3)
        self._check_failures()

    def _check_failures(self):
        if self._failure_req is not None and self._failure_req.Test(self._status):
            text = bytes(self._failure_buf).rstrip(b"\0").decode(errors="replace")
            raise WorkerFailed(self._status.Get_source(), text)

    def sync(self):
        """Blocks until every rank has arrived, sleeping instead of spinning."""
        self._sleep_wait(self.comm.Ibarrier())

    # -- collectives on the round path ------------------------------------------------------------
    def bcast(self, buf):
        """Rank 0's `buf` (a contiguous numpy array) is copied into every rank's `buf` in place."""
        self.sync()
        self.comm.Bcast(buf, root=0)
        return buf

    def reduce_sum(self, buf):
        """Element-wise sum of every rank's `buf` into rank 0's `buf` (in place there)."""
        self.sync()
        if self.rank == 0:
            self.comm.Reduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM, root=0)
        else:
            self.comm.Reduce(buf, None, op=self.MPI.SUM, root=0)
        return buf

    def any_flag(self, flag: bool) -> bool:
        """True on every rank if `flag` is true on any rank (used for stop requests)."""
        out = np.zeros(1, dtype=np.int32)
        req = self.comm.Iallreduce(np.array([int(flag)], dtype=np.int32), out, op=self.MPI.MAX)
        self._sleep_wait(req)
        return bool(out[0])

    # -- setup and failure handling ---------------------------------------------------------------
    def node_local(self):
        """(rank among the ranks on this node, ranks on this node, whether the server is one of them)."""
        local = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            lowest = np.zeros(1, dtype=np.int64)
            local.Allreduce(np.array([self.rank], dtype=np.int64), lowest, op=self.MPI.MIN)
            return local.Get_rank(), local.Get_size(), bool(lowest[0] == 0)
        finally:
            local.Free()

    def report_failure(self, text):
        """Worker side: tell the server why this rank fails, give it time to record it, then abort."""
        if self.rank == 0:
            return
        data = text.encode()[: FAILURE_BYTES - 1]
        req = self.comm.Issend([data, self.MPI.BYTE], dest=0, tag=FAILURE_TAG)
        deadline = time.monotonic() + FAILURE_GRACE_S
        while not req.Test() and time.monotonic() < deadline:
            time.sleep(0.01)
        # The server aborts the job once it has written the error; wait for that, within reason.
        while time.monotonic() < deadline:
            time.sleep(0.05)

    def abort(self, code):
        self.comm.Abort(code)

    def close(self):
        """Cancels the server's standing failure receive so MPI finalizes cleanly."""
        if self._failure_req is not None:
            self._failure_req.Cancel()
            self._failure_req.Wait()
            self._failure_req = None


def make_comm():
    """MpiComm when launched under an MPI launcher with more than one rank, else LocalComm."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() == 1:
        return LocalComm()
    return MpiComm()
