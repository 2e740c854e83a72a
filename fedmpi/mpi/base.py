"""What a communicator is (`Comm`, a typing.Protocol that `MpiComm` and `LocalComm` both implement and that
the round engine is written against), and the errors that travel between ranks."""

from __future__ import annotations

import functools
from typing import Protocol, runtime_checkable

import numpy as np

from fedmpi.core.errors import FedmpiError
from fedmpi.core.timing import Timer
from fedmpi.mpi import signals
from fedmpi.mpi.topology import NodeInfo


def error_text(error):
    """What a rank says about an error it raised: the message of a FedmpiError, else 'Type: message'."""
    return str(error) if isinstance(error, FedmpiError) else f"{type(error).__name__}: {error}"


# A worker's failure report starts with the round it failed in (MpiComm.report_failure, `split_round`).
ROUND_MARK = "@round "
# The most bytes a failure report (MpiComm.report_failure) or a node's error text (`_node_text`) carries.
FAILURE_BYTES = 8192


def split_round(text):
    """(the round a worker's failure report names, or None; the report without that line)."""
    head, _, rest = text.partition("\n")
    if head.startswith(ROUND_MARK):
        try:
            return int(head[len(ROUND_MARK):]), rest
        except ValueError:
            pass
    return None, text


def arrive_first(method):
    """For MpiComm's collectives of set-up that are made of blocking MPI calls (communicators, windows, small
    reductions): every rank first waits until all have arrived, asleep (`MpiComm.sync`), and a worker holds a
    Ctrl-C back until the collective has ended (`MpiComm._whole`). A rank inside a blocking MPI call runs no
    Python code, so it hears no Ctrl-C, and MPICH's spins at full CPU: rank 0, having run ahead into one while
    an interrupted worker never came, could not end the job, which the worker then ended after its grace
    with its own line instead of rank 0's. Asleep, rank 0 ends it at once. A test may pause at the entry
    (signals.test_pause with the method's name)."""
    @functools.wraps(method)
    def together(self, *args, **kwargs):
        signals.test_pause(method.__name__)
        with self._whole():
            self.sync()
            return method(self, *args, **kwargs)
    return together


def exit_code_of(error):
    """The exit code a rank ends with for `error`: a FedmpiError's own, else 1."""
    return error.exit_code if isinstance(error, FedmpiError) else 1


class WorkerFailed(Exception):
    """Raised on the server when a worker reports an exception; the job is then aborted."""

    def __init__(self, rank, text):
        self.rank, self.text = rank, text
        super().__init__(f"rank {rank}: {text}")


@runtime_checkable
class Comm(Protocol):
    """The communicator the round engine, the data loader and the checkpoints use. Rank 0 is the server;
    `workers` are the ranks that may host clients. Buffers are numpy arrays (or device arrays with
    CUDA-aware MPI); every collective is entered by every rank."""

    rank: int
    size: int
    workers: tuple
    timer: Timer

    @property
    def is_server(self) -> bool: ...

    @property
    def node_leader(self) -> bool: ...

    def enter_round(self, t: int) -> None:
        """Every rank, at the start of round t: a worker's failure report names its round, and the server
        lets the collectives of an earlier round that the worker finished complete first."""

    def bcast(self, buf: np.ndarray) -> np.ndarray:
        """Rank 0's `buf` on every rank (in place)."""

    def reduce_sum(self, buf: np.ndarray) -> np.ndarray:
        """The sum of every rank's `buf` on rank 0 (in place there)."""

    def reduce_sum_mod(self, buf: np.ndarray, bits: int) -> np.ndarray:
        """Secure aggregation's integer sum: every rank's uint64 `buf` added with wraparound (exact modulo
        2^64), then reduced modulo 2^`bits` on rank 0 (in place there); 2^bits divides 2^64, so the result
        is the exact sum modulo 2^bits whatever the order or the number of ranks."""

    def round_buffers(self, down_len: int, up_len: int, host_buffers: bool = True):
        """Node-shared round buffers (fedmpi.mpi.node_buffers) or None where MPI moves them."""

    def ticket_counter(self):
        """Collective: a job-wide counter (fedmpi.mpi.tickets.TicketCounter: `take`, `reset`) that deals a
        round's clients to the workers as they become free, or None where it cannot (one process, several
        nodes)."""

    def sync(self) -> None:
        """A sleeping barrier."""

    def route(self, sends: list, receives: list) -> None:
        """Point-to-point moves: `sends` [(dst, slot, array)], `receives` [(src, slot, buffer)]."""

    def masked_gather(self, mask: np.ndarray, vectors: list, hosted_selected: dict, dim: int) -> dict:
        """Rank 0: {client id: vector} of the selected clients whose mask entry is set."""

    def gather_rows(self, block: np.ndarray, rows_by_rank: list, width: int) -> np.ndarray:
        """Rank 0: every rank's [k_r, width] float32 `block` stacked in rank order (None elsewhere)."""

    def report_failure(self, text: str) -> None:
        """A worker tells rank 0 why it fails (rank 0 records it and ends the job)."""

    def agree(self, code: int) -> tuple:
        """(the worst exit code over the ranks, the lowest rank that has it)."""

    def gather_states(self, host, get_state, put_state) -> None:
        """Every client's state, from the rank hosting it, to `put_state` on rank 0 in client order."""

    def node_local(self, gpus: int = 0) -> NodeInfo:
        """This rank's node: its local rank and size, cores, GPUs, whether rank 0 is on it."""

    def share_arrays(self, specs, fill) -> dict:
        """One read-only copy of the arrays `specs` for all the node's ranks, each filling its share."""

    def abort(self, code: int) -> None:
        """Ends every rank of the job at once with `code`."""

    def close(self) -> None:
        """Frees what the communicator holds (windows, requests)."""
