"""Communication between the server (rank 0) and the workers (ranks >= 1).

With fedmpi.mpi.launcher (MPI's start), the only module that imports mpi4py. `MpiComm` moves flat numpy
float32 buffers with buffer-based (uppercase) calls; `LocalComm` is its single-process twin with the same
methods, so every algorithm runs unchanged at `-n 1`.

Node-local data: `share_arrays` (fedmpi.mpi.node_comm, on fedmpi.mpi.shared_arrays); pretend nodes:
fedmpi.mpi.topology.

Waiting: a rank that waits for others (the server while workers train, a worker while the server
evaluates) must not burn a core that a training rank needs. Each phase therefore starts with a tiny
non-blocking collective polled with sleeps (`_sleep_wait`); once everyone has arrived, the large buffer
moves with a blocking call at full speed, or, for the round buffers of a job on one node, without MPI at
all (`round_buffers`, fedmpi.mpi.node_buffers; on several nodes through the node leaders,
fedmpi.mpi.hierarchy).

Vectors beyond 2^31 bytes: every large transfer goes through fedmpi.mpi.large_count (MPI-4 large counts
where the library has them, slices otherwise).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from fedmpi.core import console
from fedmpi.core.timing import Timer
from fedmpi.mpi import hierarchy, large_count, node_buffers, signals
from fedmpi.mpi.base import FAILURE_BYTES, ROUND_MARK, WorkerFailed, arrive_first, split_round
from fedmpi.mpi.local import LocalComm, _uint64, reduce_mod
from fedmpi.mpi.node_comm import NodeCollectives
from fedmpi.mpi.signals import start_mpi
from fedmpi.mpi.state_codec import recv_state, send_state
from fedmpi.mpi.tickets import TicketCounter

FAILURE_TAG = 77
ROUTE_TAG = 1000          # + slot index: FedSkip's point-to-point slot transfers
STATE_TAG = 78            # gather_states: one client's state (fedmpi.mpi.state_codec) to rank 0
# Sleeps between polls while a rank waits for the others (`MpiComm._sleep_wait`).
SLEEP_MIN_S, SLEEP_MAX_S = 5e-5, 2e-3
SLEEP_FRACTION = 0.05     # of the time waited so far: a wait overshoots by at most ~5%
# How long a failing worker waits for the server to record its error before aborting the job itself.
FAILURE_GRACE_S = 10.0

class _AllOf:
    """Adapts a list of requests to the single-request `Test()` that `_sleep_wait` polls."""

    def __init__(self, mpi, requests):
        self.mpi, self.requests = mpi, requests

    def Test(self):  # noqa: N802 - mirrors mpi4py's Request.Test
        return self.mpi.Request.Testall(self.requests)


class MpiComm(NodeCollectives):
    """Rank 0 is the server and hosts no clients; ranks 1..P-1 are workers. The collectives among one node's
    ranks (its communicator, its cores, shared arrays) come from `NodeCollectives` (fedmpi.mpi.node_comm)."""

    def __init__(self, mpi_comm=None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = mpi_comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.workers = tuple(range(1, self.size))
        self.timer = Timer()     # `wait` (sleeping until others arrive), `bcast`, `reduce` (the transfers)
        self._failure_buf = bytearray(FAILURE_BYTES)
        self._failure_req = (self.comm.Irecv([self._failure_buf, MPI.BYTE], source=MPI.ANY_SOURCE,
                                             tag=FAILURE_TAG) if self.rank == 0 else None)
        self._status = MPI.Status()
        self._failure = None        # a reported failure not raised yet (see _check_failures)
        self._failure_round = None  # the round that failure happened in (None: before the first round)
        self.round = None           # the round this rank is in (`enter_round`; None before the first)
        self._node = None           # the node's communicator (pretend nodes under FEDMPI_TEST_NODES), made once
        self._windows = []          # shared-memory windows of `share_arrays`, freed by `close`
        self._round = None          # the round buffers' hierarchy.NodeRound (`round_buffers`), freed by `close`
        self._tickets = None        # the clients' tickets.TicketCounter (`ticket_counter`), freed by `close`

    @property
    def is_server(self):
        return self.rank == 0

    # -- waiting -------------------------------------------------------------------------------
    def _sleep_wait(self, request):
        """Polls `request`, sleeping SLEEP_FRACTION of the time waited so far between polls (SLEEP_MIN_S ..
        SLEEP_MAX_S): a short wait (W2's rounds take tens of ms) overshoots by at most ~5%, a long one
        wakes ~500 times a second, ~1% of a core. The server also watches for failures.

        MPICH's blocking calls spin (MPIR_CVAR_POLLS_BEFORE_YIELD / ENABLE_HEAVY_YIELD only add
        sched_yield calls to the spin); Open MPI's spin too unless mpi_yield_when_idle is set, which
        likewise yields without sleeping. Polling a non-blocking call with sleeps frees the core for the
        ranks that train with any MPI (docs/results/performance.md has the measurements)."""
        if not request.Test():
            began = time.monotonic()
            while not request.Test():
                self._check_failures(request)
                time.sleep(min(SLEEP_MAX_S, max(SLEEP_MIN_S, SLEEP_FRACTION * (time.monotonic() - began))))
            self.timer.add("wait", time.monotonic() - began)
        # No check once the collective has completed: every rank took part in it, so a failure reported
        # since then is raised at the next wait, after this round's work (its log row) is done.

    def enter_round(self, t):
        """Every rank, at the start of round t (before anything of the round can fail)."""
        self.round = t

    def _check_failures(self, request):
        """Raises WorkerFailed for a failure a worker reported, unless `request` (the collective waited for)
        has completed meanwhile, or the worker failed in a later round than this one: either way the failing
        rank took part in this collective (a worker in round t+1 has finished every collective of round t),
        which completes once the others arrive, so that the server's round finishes and its row is kept; the
        failure is raised at a later wait."""
        if self._failure is None and self._failure_req is not None and self._failure_req.Test(self._status):
            text = bytes(self._failure_buf).rstrip(b"\0").decode(errors="replace")
            self._failure_round, text = split_round(text)
            self._failure = WorkerFailed(self._status.Get_source(), text)
        ahead = (self._failure_round is not None and self.round is not None and self._failure_round > self.round)
        if self._failure is not None and not ahead and not request.Test():
            raise self._failure

    def sync(self):
        """Blocks until every rank has arrived, sleeping instead of spinning."""
        self._sleep_wait(self.comm.Ibarrier())

    # -- collectives on the round path ------------------------------------------------------------
    def _whole(self):
        """A worker takes part in the barrier and the blocking collective after it as one step: a Ctrl-C in
        between would leave rank 0 blocked in the collective (signals.interrupt_after). Rank 0 acts on a
        Ctrl-C at once: its failure aborts the job."""
        return signals.interrupt_after() if self.rank != 0 else contextlib.nullcontext()

    def bcast(self, buf):
        """Rank 0's `buf` (a contiguous numpy array) is copied into every rank's `buf` in place."""
        span = self._node_span(buf, "down")
        with self._whole():
            self._arrive(span)
            if span is None:
                with self.timer.phase("bcast"):
                    large_count.bcast(self.comm, self.MPI, buf, root=0)
                return buf
            with self.timer.phase("bcast"):
                self._round.bcast_leaders(buf)
            self._round.await_leader(self._sleep_wait)      # its sleep counts as `wait`, not `bcast`
        return buf      # (on one node, the node's broadcast slot: every rank's buffer is rank 0's slot)

    def reduce_sum(self, buf):
        """Element-wise sum of every rank's `buf` into rank 0's `buf` (in place there)."""
        span = self._node_span(buf, "up")
        with self._whole():
            self._arrive(span)
            with self.timer.phase("reduce"):
                if span is not None:
                    self._round.reduce(span)
                else:
                    large_count.reduce_sum(self.comm, self.MPI, buf, self.rank == 0)
        return buf

    def reduce_sum_mod(self, buf, bits):
        """Secure aggregation's exact integer sum: every rank's uint64 `buf` summed by MPI (UINT64_T addition
        wraps modulo 2^64, as C's unsigned addition does), then taken modulo 2^bits on rank 0 (in place
        there). Modular addition is associative, so the result is bit-identical at any -n. The waiting
        sleeps, as elsewhere; the transfer itself is a blocking Reduce."""
        buf = _uint64(buf)
        with self._whole():
            self.sync()
            with self.timer.phase("reduce"):
                large_count.reduce_sum(self.comm, self.MPI, buf, self.rank == 0, datatype=self.MPI.UINT64_T)
        if self.rank == 0:
            reduce_mod(buf, bits)
        return buf

    # -- the round's buffers in node-shared memory (fedmpi.mpi.node_buffers) ---------------------------
    @arrive_first
    def round_buffers(self, down_len, up_len, host_buffers=True):
        """Collective: (down float32[down_len], up float64[up_len]), the node's broadcast slot (its first rank's,
        read-only on the others) and this rank's reduction slot of its node's shared window, through which
        `bcast` and `reduce_sum` of (slices of) them move: within a node by shared memory, between nodes by
        one MPI collective among the node leaders (fedmpi.mpi.hierarchy), where
        every rank passes `host_buffers` (it moves host memory, not device buffers) and FEDMPI_NODE_BUFFERS
        is not 0; else None (the caller allocates its own buffers and MPI moves them among all ranks)."""
        if self._round is not None:     # its slots back another experiment's buffers until `close`
            raise RuntimeError("MpiComm.round_buffers: called twice; one experiment per communicator")
        node = self._node_comm()
        vote = np.array([int(host_buffers and node_buffers.wanted())])
        every = np.zeros(1, dtype=vote.dtype)
        self.comm.Allreduce(vote, every, op=self.MPI.MIN)
        if not every[0]:
            return None
        self._round = hierarchy.NodeRound(self.MPI, self.comm, node, down_len, up_len)
        mine = node.Get_rank()
        return self._round.buffers.down, self._round.buffers.up[mine]

    @arrive_first
    def ticket_counter(self):
        """Collective: a job-wide tickets.TicketCounter where every rank is on one node, else None."""
        node = self._node_comm()
        if node.Get_size() != self.size:
            return None
        if self._tickets is None:
            self._tickets = TicketCounter(self.MPI, node)
        return self._tickets

    def _node_span(self, buf, kind):
        return self._round.span(buf, kind) if self._round is not None else None

    def _arrive(self, span):
        """Waits (asleep) until every rank has arrived; around that, with node buffers, the memory barriers
        that make each rank's writes to its slot visible to the others."""
        if span is not None:
            self._round.sync_memory()
        self.sync()
        if span is not None:
            self._round.sync_memory()

    # -- checkpoints ------------------------------------------------------------------------------
    def gather_states(self, host, get_state, put_state):
        """Streams every client's state to rank 0, one client at a time, in client order.

        `host[c]` is the rank hosting client c (the same array on every rank). The host calls
        `get_state(c)` (a dict of numpy arrays) and sends it as plain buffers (no pickle); rank 0 calls
        `put_state(c, state)` and may drop the arrays afterwards, so it never holds more than one client's
        state. Every host sends its clients in increasing order, which is the order rank 0 receives them
        in, so the exchange cannot deadlock. Waits sleep instead of spinning, as elsewhere.
        """
        for cid in range(len(host)):
            owner = int(host[cid])
            if owner == self.rank == 0:
                put_state(cid, get_state(cid))
            elif self.rank == owner:
                send_state(self._send_state_part, get_state(cid))
            elif self.rank == 0:
                put_state(cid, recv_state(lambda a, src=owner: self._recv_state_part(a, src)))

    def _send_state_part(self, a):
        self._sleep_wait(_AllOf(self.MPI, large_count.isend(self.comm, self.MPI, a.reshape(-1).view(np.uint8),
                                                            dest=0, tag=STATE_TAG)))

    def _recv_state_part(self, a, source):
        self._sleep_wait(_AllOf(self.MPI, large_count.irecv(self.comm, self.MPI, a.reshape(-1).view(np.uint8),
                                                            source=source, tag=STATE_TAG)))
        return a

    def route(self, sends, receives):
        """Point-to-point transfers of flat float32 buffers: `sends` are (dest, key, buffer), `receives`
        (source, key, buffer); `key` (e.g. a FedSkip slot) tells concurrent transfers apart."""
        lc, requests = large_count, []
        for dest, key, buf in sends:
            requests += lc.isend(self.comm, self.MPI, buf, dest=dest, tag=ROUTE_TAG + key)
        for src, key, buf in receives:
            requests += lc.irecv(self.comm, self.MPI, buf, source=src, tag=ROUTE_TAG + key)
        self._sleep_wait(_AllOf(self.MPI, requests))

    def masked_gather(self, mask, vectors, hosted_selected, dim):
        """Gated uploads: first every worker's upload mask for its selected clients, then only the
        uploaders' vectors, both by Gatherv to rank 0. Returns {client id: vector} there, None elsewhere.

        `hosted_selected[r]` lists the selected clients rank r hosts (every rank knows it), in the order
        that rank's `mask` and `vectors` follow."""
        counts = [len(hosted_selected.get(r, [])) for r in range(self.size)]
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
        all_mask = np.zeros(sum(counts), dtype=np.int8) if self.rank == 0 else None
        send = np.concatenate(vectors) if vectors else np.empty(0, dtype=np.float32)
        with self._whole():
            self.sync()
            self.comm.Gatherv(np.ascontiguousarray(mask, dtype=np.int8),
                              [all_mask, counts, displs, self.MPI.INT8_T] if self.rank == 0 else None, root=0)
            if self.rank != 0:      # (the selected clients bound the uploads: the same slices everywhere)
                large_count.gather_rows(self.comm, self.MPI, send, dim, sum(counts))
                return None
        uploads = [int(all_mask[d:d + c].sum()) for d, c in zip(displs, counts)]
        received = np.empty((sum(uploads), dim), dtype=np.float32)
        large_count.gather_rows(self.comm, self.MPI, send, dim, sum(counts), uploads, received)
        out, row = {}, 0
        for r in range(self.size):
            for cid, m in zip(hosted_selected.get(r, []), all_mask[displs[r]:displs[r] + counts[r]]):
                if m:
                    out[cid] = received[row]
                    row += 1
        return out

    def gather_rows(self, block, rows_by_rank, width):
        """One chunk of the round's update matrix (robust aggregation): every rank's `block` ([k_r, width]
        float32, its clients' rows) by one Gatherv to rank 0, which gets the [sum k_r, width] rows in rank
        order (None elsewhere). `rows_by_rank[r]` is k_r, which every rank knows from the round's plan."""
        rows = [int(k) for k in rows_by_rank]
        received = np.empty((sum(rows), width), dtype=np.float32) if self.rank == 0 else None
        with self._whole():
            self.sync()
            with self.timer.phase("reduce"):
                large_count.gather_rows(self.comm, self.MPI, block, width, sum(rows),
                                        rows if self.rank == 0 else None, received)
        return received

    # -- setup and failure handling ---------------------------------------------------------------
    def agree(self, code):
        """Collective: every rank's exit code (0 = fine) -> (worst code, lowest rank with that code).

        Set-up ends with this vote so that an error on any rank (a bad config, a missing file on one node)
        ends every rank with the same code and one message, before anything is written and without MPI_Abort.
        One MAX reduction of code * (size + 1) + (size - rank) gives both; waiting sleeps, as elsewhere (rank 0
        may spend minutes pretraining while the workers wait here)."""
        value = np.array([code * (self.size + 1) + (self.size - self.rank) if code else 0], dtype=np.int64)
        worst = np.zeros(1, dtype=np.int64)
        self._sleep_wait(self.comm.Iallreduce(value, worst, op=self.MPI.MAX))
        if worst[0] == 0:
            return 0, -1
        return int(worst[0] // (self.size + 1)), int(self.size - worst[0] % (self.size + 1))


    def report_failure(self, text):
        """Worker side: tell the server why this rank fails, give it time to record it, then abort."""
        if self.rank == 0:
            return
        if self.round is not None:
            text = f"{ROUND_MARK}{self.round}\n{text}"
        data = text.encode()[: FAILURE_BYTES - 1]
        req = self.comm.Issend([data, self.MPI.BYTE], dest=0, tag=FAILURE_TAG)
        deadline = time.monotonic() + FAILURE_GRACE_S
        while not req.Test() and time.monotonic() < deadline:
            time.sleep(0.01)
        # The server aborts the job once it has written the error; wait for that, within reason.
        while time.monotonic() < deadline:
            time.sleep(0.05)

    def abort(self, code):
        console.drain()         # what this rank printed last (its error line) must not die with the job
        self.comm.Abort(code)

    def close(self):
        """Frees the node's shared windows (collective: every rank closes at the same point; the arrays of
        `share_arrays` are gone after this) and cancels the server's standing failure receive, so MPI
        finalizes cleanly."""
        for win in self._windows:
            win.Free()
        self._windows = []
        if self._tickets is not None:
            self._tickets.free()
            self._tickets = None
        if self._round is not None:
            self._round.free()
            self._round = None
        if self._node is not None:
            self._node.Free()
            self._node = None
        if self._failure_req is not None and self._failure is None:     # (a received failure completed it)
            self._failure_req.Cancel()
            self._failure_req.Wait()
        self._failure_req = None


def make_comm():
    """MpiComm when launched under an MPI launcher with more than one rank, else LocalComm."""
    if start_mpi().COMM_WORLD.Get_size() == 1:
        return LocalComm()
    return MpiComm()
