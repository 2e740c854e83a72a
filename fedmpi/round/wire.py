"""What travels each round, laid out once: the broadcast and the reduction buffers, and their device staging.

Broadcast (float32): [command, round] header, then the upload stages' header values (`header_extra`,
e.g. the adaptive clip of differential privacy; none by default), then the algorithm's down payload
(`down_vectors * dim`). Reduction (float64): the upload sums (`up_vectors * dim + up_scalars`, then the
stages' sums, `up_extra`), the round's scalar statistics (STATS below), one row of timing.PHASES per rank
(fedmpi.core.timing), each rank's own row filled, then one block per per-client figure (local loss, the
algorithm's `client_columns`, the drift figures when asked for) of the round's S selected clients in plan
order: every rank knows the plan, so a client's value goes to its slot and the others stay zero. The
reduction thus grows with the clients selected, not with N (N-blocks would be, at
100,000 clients, 800 kB a figure from every rank each round). Sums are float64 so that their
value does not depend on how clients are spread over ranks (float32 addition is not associative); what a
real client would send is still float32, and bytes are counted as such.

On a GPU each direction also has one device buffer, made here once: the broadcast payload is staged through
the pinned host buffer into the device buffer and the reduced sums likewise, with no allocation per round.
With runtime.cuda_aware_mpi the device buffers go to MPI themselves (mpi4py reads
__cuda_array_interface__) and the host copies of the vectors are skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.core.timing import PHASES
from fedmpi.uploads.precision import itemsize, round_to

HEADER = 2
CMD_RUN, CMD_STOP = 0.0, 1.0
# Scalars riding in the reduction after the upload vectors. STOP counts the ranks that received a stop
# signal (fedmpi.mpi.signals): the request reaches the server without a collective of its own.
# UPDATE_SQ is sum_i w_i ||Delta_i||^2 over the round's counted uploads (the drift diagnostics).
WEIGHT, LOSS, SEEN, UPLOADS, BYTES_UP, UPDATE_SQ, STOP = range(7)
N_STATS = 7
# Test aid: with runtime.cuda_aware_mpi, exercise the device-buffer path on a CPU device when this is set.
DEVICE_MPI_TEST = "FEDMPI_TEST_DEVICE_MPI"


@dataclass
class RoundTally:
    """One rank's running totals for a round; `acc` is the upload accumulator on the rank's device."""

    acc: torch.Tensor
    # float64 on the host: float32 loss sums added in float64 do not depend on their order (clients dealt as
    # workers become free, or over a different number of ranks), so train_loss does not either
    loss: float
    columns: dict
    upload_bytes: int          # what one upload costs unless a stage says otherwise (up_vectors float32 vectors)
    weight: float = 0.0
    seen: int = 0
    uploads: int = 0
    bytes_up: int = 0
    update_sq: float = 0.0

    def upload(self, payload_bytes=None):
        """Counts one upload and its bytes (`payload_bytes`, e.g. compressed, or None: the dense default)."""
        self.uploads += 1
        self.bytes_up += self.upload_bytes if payload_bytes is None else int(payload_bytes)

    def record(self, run):
        """Adds a trained client's loss and per-client figures."""
        self.loss += float(run.loss_sum)
        self.seen += run.seen
        for name, value in run.figures.items():
            self.columns[name][run.cid] = value


@dataclass
class RoundStats:
    """The reduced statistics of a round, on the server."""

    weight: float
    loss: float
    seen: float
    uploads: float
    bytes_up: float
    update_sq: float
    stop_votes: int


class ClientSlots:
    """One figure's block of the reduction: the round's selected clients in plan order."""

    def __init__(self, block, slots, selected):
        self.block, self.slots, self.selected = block, slots, selected

    def __setitem__(self, cid, value):
        slot = self.slots.get(int(cid))
        if slot is None:
            raise KeyError(f"client {cid} is not among the round's selected clients: its figures have no slot")
        self.block[slot] = value

    def __getitem__(self, cids):
        """Values of the clients `cids` (the round's selected ones, or a subset)."""
        cids = np.asarray(cids, dtype=np.int64)
        if len(cids) == len(self.selected) and np.array_equal(cids, self.selected):
            return self.block.copy()
        return self.block[[self.slots[int(c)] for c in cids]]


class RoundBuffers:
    def __init__(self, comm, algo, dim, num_clients, device, cuda_aware_mpi, header_extra=0, up_extra=0,
                 extra_columns=(), wire_dtype="float32"):
        """`header_extra` floats ride in the broadcast header after [command, round] and `up_extra` float64
        sums after the algorithm's upload sums (the upload stages' room, fedmpi.uploads.base.layout);
        `extra_columns` are per-client figures beyond the loss and the algorithm's. `wire_dtype`
        (runtime.wire_dtype) is what the broadcast payload is rounded to (fedmpi.uploads.precision)."""
        self.comm, self.dim, self.num_clients, self.device = comm, dim, num_clients, device
        self.wire_dtype = wire_dtype
        pin = device.type == "cuda"
        self.header_len = HEADER + header_extra
        self.up_len = algo.up_vectors * dim + algo.up_scalars + up_extra
        # Counted as a real client would send them: the shared entries only (personal ones stay home), the update
        # at the wire dtype's width and any further vector (SCAFFOLD's control update) as float32.
        self.upload_bytes = algo.wire_dim * (itemsize(wire_dtype) + 4 * (algo.up_vectors - 1)) \
            if algo.up_vectors else 0
        self.columns = ("loss",) + tuple(algo.client_columns) + tuple(extra_columns)
        self.timing_at = self.up_len + N_STATS
        self.blocks_at = self.timing_at + comm.size * len(PHASES)
        self.selected, self.slots = np.zeros(0, dtype=np.int64), {}    # the round's clients and their slots
        self.device_mpi = cuda_aware_mpi and (pin or bool(os.environ.get(DEVICE_MPI_TEST)))
        staged = pin or self.device_mpi
        down_len = self.header_len + algo.down_vectors * dim
        # Room for blocks of every client: a round may select up to N (Poisson sampling, central...).
        up_len = self.blocks_at + len(self.columns) * num_clients
        # Host buffers in node-shared memory (fedmpi.mpi.node_buffers, across nodes fedmpi.mpi.hierarchy),
        # also on a GPU without CUDA-aware MPI: the device buffers are then staged through this rank's slot
        # (pageable, not pinned, memory) instead of a pinned buffer of its own, so that GPU ranks take the
        # node-shared and hierarchical round too. Only device buffers that MPI moves itself stay out.
        shared = comm.round_buffers(down_len, up_len, host_buffers=not self.device_mpi)
        self.node_shared = shared is not None       # the round goes through node-shared memory (run.h5's round_path)
        if shared is not None:
            self.down_host, self.up_host = (torch.from_numpy(a) for a in shared)
        else:
            self.down_host = torch.zeros(down_len, dtype=torch.float32, pin_memory=pin)
            self.up_host = torch.zeros(up_len, dtype=torch.float64, pin_memory=pin)
        self.down_np, self.up_np = self.down_host.numpy(), self.up_host.numpy()
        self.down_dev = torch.zeros_like(self.down_host, device=device) if staged else None
        self.up_dev = torch.zeros_like(self.up_host, device=device) if staged else None
        # The upload accumulator: on the CPU, the reduction buffer's own head (no copy before the reduction).
        self.acc = (self.up_host[: self.up_len] if not staged and device.type == "cpu"
                    else torch.zeros(self.up_len, dtype=torch.float64, device=device))
        self.sums_on_device = False     # the last reduction left the summed vectors in up_dev (device MPI)

    # -- broadcast -------------------------------------------------------------------------------------
    def broadcast(self, t, command, fill=None, full=True, extra=()):
        """Rank 0's header ([command, t], then the `extra` values) and, if `full`, the payload that
        `fill(out)` writes, to every rank. Returns (command, round) as received; `header_values()` has
        the extra values. FedSkip's rounds inside a period send the header alone."""
        h = self.header_len
        if self.comm.is_server:
            self.down_np[0], self.down_np[1] = command, t
            if h > HEADER:
                self.down_np[HEADER:h] = extra
            payload = self.down_host[h:]
            if full and self.down_dev is not None:
                fill(self.down_dev[h:])
                round_to(self.down_dev[h:], self.wire_dtype)    # before it leaves: every rank trains from it
                if not self.device_mpi:
                    payload.copy_(self.down_dev[h:])
            elif full:
                fill(payload)
                round_to(payload, self.wire_dtype)
        if self.device_mpi:
            self.down_dev[:h].copy_(self.down_host[:h])
            self._device_ready()
            self.comm.bcast(_wire(self.down_dev if full else self.down_dev[:h]))
            self.down_host[:h].copy_(self.down_dev[:h])
        else:
            self.comm.bcast(self.down_np if full else self.down_np[:h])
        return float(self.down_np[0]), int(self.down_np[1])

    def header_values(self):
        """The extra header values of the latest broadcast, as every rank received them (float32 values)."""
        return self.down_np[HEADER: self.header_len].astype(np.float64)

    def down(self):
        """The broadcast payload on this rank's device (on the CPU, the host buffer itself)."""
        h = self.header_len
        if self.down_dev is None:
            return self.down_host[h:]
        if not self.device_mpi:
            self.down_dev[h:].copy_(self.down_host[h:], non_blocking=True)
        return self.down_dev[h:]

    # -- reduction -------------------------------------------------------------------------------------
    def start_round(self, selected):
        """Every rank, before the round's tally: the round's selected clients (the plan's, the same on every
        rank), whose per-client figures the reduction carries in this order."""
        self.selected = np.asarray(selected, dtype=np.int64)
        self.slots = {int(c): i for i, c in enumerate(self.selected)}

    @property
    def up_end(self):
        """Where this round's reduction buffer ends: after the S-blocks of its figures."""
        return self.blocks_at + len(self.columns) * len(self.selected)

    def new_tally(self) -> RoundTally:
        """Clears this rank's contribution to the round's reduction."""
        self.up_host[: self.up_end].zero_()
        if self.acc.data_ptr() != self.up_host.data_ptr():
            self.acc.zero_()
        return RoundTally(self.acc, 0.0, self.client_figures(), self.upload_bytes)

    def reduce(self, tally, stop_requested, sums=True, skip=0):
        """Writes this rank's totals and does the round's one reduction to rank 0. `sums=False` reduces
        only the statistics and per-client figures (FedSkip inside a period; gated SAFL, whose vectors
        travel by masked gather); `skip` leaves the first `skip` sums out (secure aggregation's model
        vector, which travels as masked integers): on rank 0 they hold its own values only. With device MPI
        the sums travel from `up_dev` and stay there on rank 0."""
        target = (self.up_dev if self.device_mpi else self.up_host)[: self.up_len]
        if target.data_ptr() != tally.acc.data_ptr():
            target.copy_(tally.acc)
        stats = self.up_host[self.up_len: self.up_len + N_STATS]
        stats[WEIGHT], stats[LOSS], stats[SEEN] = tally.weight, tally.loss, tally.seen
        stats[UPLOADS], stats[BYTES_UP], stats[UPDATE_SQ] = tally.uploads, tally.bytes_up, tally.update_sq
        stats[STOP] = float(stop_requested)
        row = self.timing_at + self.comm.rank * len(PHASES)
        self.up_np[row: row + len(PHASES)] = self.comm.timer.take()
        end = self.up_end
        if not self.device_mpi:
            self.comm.reduce_sum(self.up_np[skip:end] if sums else self.up_np[self.up_len:end])
            self.sums_on_device = False
            return
        tail = slice(self.up_len, end)
        self.up_dev[tail].copy_(self.up_host[tail])
        self._device_ready()
        self.comm.reduce_sum(_wire(self.up_dev[skip:end] if sums else self.up_dev[tail]))
        if self.comm.is_server:
            self.up_host[tail].copy_(self.up_dev[tail])
        self.sums_on_device = sums

    def sums(self):
        """Server: the reduced upload sums on this rank's device."""
        if self.sums_on_device:
            return self.up_dev[: self.up_len]
        if self.up_dev is None:
            return self.up_host[: self.up_len]
        self.up_dev[: self.up_len].copy_(self.up_host[: self.up_len], non_blocking=True)
        return self.up_dev[: self.up_len]

    def stats(self) -> RoundStats:
        s = self.up_np[self.up_len: self.up_len + N_STATS].astype(np.float64)
        return RoundStats(float(s[WEIGHT]), float(s[LOSS]), float(s[SEEN]), float(s[UPLOADS]), float(s[BYTES_UP]),
                          float(s[UPDATE_SQ]), int(s[STOP]))

    def timing(self) -> np.ndarray:
        """Server: the reduced [rank, phase] seconds of the round (a copy)."""
        return self.up_np[self.timing_at:self.blocks_at].reshape(self.comm.size, len(PHASES)).copy()

    def client_figures(self, buf=None):
        """The round's per-client blocks of the reduction buffer, by figure name: `column[cid] = value` puts a
        selected client's value in its slot, `column[selected]` reads the values of the plan's clients."""
        buf = self.up_np if buf is None else buf
        s, start = len(self.selected), self.blocks_at
        return {name: ClientSlots(buf[start + i * s: start + (i + 1) * s], self.slots, self.selected)
                for i, name in enumerate(self.columns)}

    def share(self, x):
        """Collective: rank 0's float32 vector `x` (`dim` entries, the global model) to every rank, through the
        broadcast buffer's payload (free between rounds); returns it on this rank's device."""
        if self.comm.size == 1:
            return x
        span = slice(self.header_len, self.header_len + self.dim)
        if self.device_mpi:
            buf = self.down_dev[span]
            if self.comm.is_server:
                buf.copy_(x)
            self._device_ready()
            self.comm.bcast(_wire(buf))
            return buf
        host = self.down_host[span]
        if self.comm.is_server:
            host.copy_(x)
        self.comm.bcast(host.numpy())
        if self.down_dev is None:
            return host
        self.down_dev[span].copy_(host, non_blocking=True)
        return self.down_dev[span]

    def _device_ready(self):
        """MPI reads device buffers outside torch's stream order: finish the kernels that fill them."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _wire(tensor):
    """What the communicator moves for a tensor: a numpy view on the CPU, the tensor itself on a GPU."""
    return tensor.numpy() if tensor.device.type == "cpu" else tensor
