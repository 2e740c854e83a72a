"""`LocalComm`: the communicator of a one-process run, the twin of `MpiComm` with the same methods (both are
`fedmpi.mpi.base.Comm`), so that every algorithm runs unchanged at `-n 1` and in `fedmpi.simulate`."""

from __future__ import annotations

import os

import numpy as np

from fedmpi.core.timing import Timer
from fedmpi.mpi.runtime import usable_cores
from fedmpi.mpi.shared_arrays import read_only
from fedmpi.mpi.topology import NodeInfo


def _uint64(buf):
    if buf.dtype != np.uint64 or not buf.flags.c_contiguous:
        raise TypeError(f"reduce_sum_mod takes a contiguous uint64 buffer, not {buf.dtype}")
    return buf


def reduce_mod(buf, bits):
    """`buf` modulo 2^bits in place (bits in 1..64): the low `bits` bits of each entry."""
    if not 1 <= int(bits) <= 64:
        raise ValueError(f"reduce_sum_mod: bits = {bits}, must be in 1..64")
    if bits < 64:
        np.bitwise_and(buf, np.uint64((1 << int(bits)) - 1), out=buf)
    return buf


class LocalComm:
    """Everything in one process: rank 0 is server and the only worker."""

    rank = 0
    size = 1
    workers = (0,)

    def __init__(self):
        self.timer = Timer()

    @property
    def is_server(self):
        return True

    def enter_round(self, t):
        self.round = t

    def bcast(self, buf):
        return buf

    def reduce_sum(self, buf):
        return buf

    def reduce_sum_mod(self, buf, bits):
        """One rank's integers are already the sum; reduced modulo 2^bits (see MpiComm.reduce_sum_mod)."""
        return reduce_mod(_uint64(buf), bits)

    def ticket_counter(self):
        return None         # one process: nothing to deal

    def round_buffers(self, down_len, up_len, host_buffers=True):
        """One process needs no shared buffers (see MpiComm.round_buffers)."""
        return None

    def sync(self):
        pass

    def route(self, sends, receives):
        """Point-to-point moves between ranks; with one rank there is nowhere to move to."""
        if sends or receives:
            raise RuntimeError("LocalComm.route: a single process has no other rank to route to")

    def masked_gather(self, mask, vectors, hosted_selected, dim):
        """{client id: vector} of the uploaders among the selected clients (all hosted here)."""
        uploaders = [c for c, m in zip(hosted_selected.get(0, []), mask) if m]
        return dict(zip(uploaders, vectors))

    def gather_rows(self, block, rows_by_rank, width):
        """One chunk of the update matrix: this process's rows are all of them (see MpiComm.gather_rows)."""
        return np.ascontiguousarray(block, dtype=np.float32).reshape(sum(rows_by_rank), width)

    def report_failure(self, text):
        pass

    def agree(self, code):
        """(the worst exit code over the ranks, the lowest rank that has it): see MpiComm.agree."""
        return code, 0

    def gather_states(self, host, get_state, put_state):
        """Every client's state to `put_state` in client order (see MpiComm.gather_states)."""
        for cid in range(len(host)):
            put_state(cid, get_state(cid))

    def node_local(self, gpus=0):
        return NodeInfo(0, 1, True, 1, usable_cores(), gpus, usable_cores())

    @property
    def node_leader(self):
        return True

    def share_arrays(self, specs, fill):
        """`MpiComm.share_arrays` in one process: plain arrays, filled whole, returned read-only."""
        if isinstance(specs, BaseException):
            raise specs
        arrays = {name: np.empty(shape, dtype=dtype) for name, (shape, dtype) in specs.items()}
        fill(arrays, 0, 1)
        return read_only(arrays)

    def abort(self, code):
        os._exit(code)

    def close(self):
        pass
