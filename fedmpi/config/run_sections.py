"""The config's sections of evaluation, checkpoints and the run time (eval, checkpoint, runtime) as frozen
dataclasses, like those of fedmpi.config.sections. Every field has a type and a default; each section
range-checks its own values in `__post_init__`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from fedmpi.core.config_checks import Checks as _Checks
from fedmpi.core.config_checks import Range, count, refuse_unused
from fedmpi.mpi.runtime import parse_bytes

# runtime.threads: torch threads per rank. A fixed bound (not this machine's cores) keeps a config valid or
# invalid alike on a login node and on the compute nodes; 4096 is above the hardware threads of any single
# node built so far, and torch.set_num_threads(100000) dies with MemoryError.
MAX_THREADS = 4096

# The runtime keys each tracker reads (fedmpi.run.tracking): a tracking key no chosen tracker reads is refused.
TRACKER_USES = {"tensorboard": (), "mlflow": ("tracking_uri", "tracking_project"), "wandb": ("tracking_project",)}


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation (`eval:`): of the global model on the test set, and of each client's model on its own split."""

    every: int = 1
    """Rounds between evaluations of the global model (the last round is always evaluated)."""
    batch_size: int = 100
    """Test batches are the unit of evaluation shared among the ranks (batch b on rank b mod P): 100 gives a
    1,000-image test set ten units to spread, and stays large enough for the kernels to be efficient."""
    divergence: bool = False
    """Weight divergence from a centralized-SGD shadow model (fedmpi.round.shadow)."""
    client_drift: bool = False
    """Per-client update norms and their cosines with the aggregate (fedmpi.round.observers)."""
    local_every: int | None = None
    """Local evaluation (fedmpi.round.local_eval) every this many rounds: each evaluated client's model on its
    own test split (partition.local_test), on its host. null = off; not forced at the last round, so that a
    resumed run logs what an uninterrupted one does."""
    local_clients: Literal["selected", "all"] = "selected"
    """Whom a local evaluation covers: the round's selected clients, or all."""
    finetune_steps: int = 0
    """Local SGD steps before a local evaluation, discarded afterwards (0: none; the FedAvg+FT baseline)."""
    max_samples: int | None = None
    """Evaluate the global model on a fixed, seeded subsample of this many global test samples (drawn once from
    (seed, EVAL_SUBSET), the same on every rank and at every -n; its indices go to run.h5's /eval/test_indices);
    null: the whole test set. For test sets too large to evaluate every few rounds."""

    RANGES: ClassVar[dict] = {"every": count(), "batch_size": count(), "local_every": count(),
                              "finetune_steps": count(0), "max_samples": count()}

    def __post_init__(self):
        c = _Checks("eval")
        c.require(self.every >= 1, "every", self.every, "must be a positive integer")
        c.require(self.local_every is None or self.local_every >= 1, "local_every", self.local_every,
                  "must be a positive integer (rounds between local evaluations) or null (off)")
        c.require(self.finetune_steps >= 0, "finetune_steps", self.finetune_steps, "must be >= 0")
        c.require(not self.finetune_steps or self.local_every is not None, "finetune_steps", self.finetune_steps,
                  "fine-tunes before a local evaluation only: set eval.local_every too, or leave it at 0")
        c.require(self.local_clients == "selected" or self.local_every is not None, "local_clients",
                  self.local_clients, "chooses whom a local evaluation covers: set eval.local_every too")
        c.require(self.batch_size >= 1, "batch_size", self.batch_size, "must be a positive integer")
        c.require(self.max_samples is None or self.max_samples >= 1, "max_samples", self.max_samples,
                  "must be a positive integer (test samples per evaluation) or null (the whole test set)")
        c.done()


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints (`checkpoint:`), from which `--resume` continues a run."""

    every: int = 10
    """Rounds between checkpoints; 0 = only on a stop request."""
    keep: int = 2
    """How many of the newest checkpoints are kept."""
    updates: bool = False
    """Record every counted client's update of every round, as the server sums it, in OUT/updates/ (one HDF5
    file per rank, read with fedmpi.uploads.recorded.read_updates): for within-round contribution estimates and
    unlearning (unlearning.method: federaser replays from them). Costs rounds x clients per round x model
    size x 4 bytes of disk (a 1M-parameter model, 10 clients, 100 rounds: 4 GB) and one file write per client
    upload. Changes no result. Only for algorithms that upload by reduce, without secure aggregation (the
    server never sees one client's update there)."""

    RANGES: ClassVar[dict] = {"every": count(0), "keep": count()}

    def __post_init__(self):
        c = _Checks("checkpoint")
        c.require(self.every >= 0, "every", self.every, "must be >= 0")
        c.require(self.keep >= 1, "keep", self.keep, "must be a positive integer")
        c.done()


@dataclass(frozen=True)
class RuntimeConfig:
    """How this job runs, not what it computes: may change on --resume."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where clients train: auto (a GPU where there is one), cpu or cuda."""
    threads: int | None = None
    """torch threads per rank; null = the node's cores / the ranks on the node."""
    progress: Literal["auto", "bar", "lines", "off"] = "auto"
    """Progress display: a bar on a terminal, rate-limited lines in a batch log (auto chooses), or off."""
    log_flush_s: float = 1.0
    """Rank 0 writes run-log rows in batches, once the oldest unwritten row has waited this long (seconds; 0:
    every round's row at once), and always before a checkpoint, a stop, a failure and the end
    (fedmpi.run.rows). Each HDF5 write costs ~10 ms however many rows it takes."""
    cuda_aware_mpi: bool = False
    """The MPI library passes GPU buffers directly; false: tensors are staged through host memory."""
    on_nonfinite: Literal["stop", "continue"] = "stop"
    """A NaN or infinite loss or model: stop (status diverged) or go on."""
    shared_data: bool = True
    """The ranks of a node share one read-only copy of the data set (MPI-3 shared memory); false: a copy each."""
    client_state_memory: str | int | None = None
    """Per-client state (SCAFFOLD's c_i, compression residuals...) kept in host memory per rank, in bytes ("4GB",
    "512MiB" or a number); beyond it, state spills to a file of the rank's in $TMPDIR. null: no limit."""
    deterministic: bool = False
    """GPU: deterministic kernels (torch.use_deterministic_algorithms, cuDNN, cuBLAS workspace) so that -n
    invariance and resume hold on GPUs too; costs speed (docs/results/performance.md)."""
    gather_memory: str | int | None = None
    """Robust aggregation: rank 0's memory for one chunk of the round's update matrix and the aggregator's
    working copies of it, in bytes like client_state_memory; null: a quarter of the memory available at the
    start (fedmpi.robust.chunks). Results do not depend on it."""
    trackers: tuple[str, ...] = ()
    """Live experiment tracking on rank 0 as the run goes (fedmpi.run.tracking; each an optional extra): any of
    tensorboard, mlflow, wandb. run.h5 stays the record; a tracker that fails is reported once and dropped."""
    tracking_uri: str | None = None
    """MLflow tracking URI; null: a file store in the run's folder."""
    tracking_project: str | None = None
    """MLflow experiment / W&B project; null: the run folder's name."""
    wire_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """What the broadcast model and each client's upload are rounded to on the wire (sums stay float64 on
    rank 0); it cannot change on --resume."""
    kernels: Literal["auto", "plain"] = "auto"
    """fedmpi.core.cpu_kernels: auto = channels-last activations and big dense layers' SGD step inside their
    backward, for the zoo's CNNs that declare them, on the CPU; plain = PyTorch's defaults. Same results to
    rounding."""
    client_dealing: Literal["auto", "static"] = "auto"
    """Clients dealt afresh each round (stateless, under the plain reduction): auto = to the workers as they
    become free, on one node, where clients train one by one (fedmpi.mpi.tickets); static = fixed shares
    balanced by sample count. The same results to float64 rounding of the sums (docs/results/performance.md)."""

    RANGES: ClassVar[dict] = {"threads": Range(1, MAX_THREADS), "log_flush_s": Range(0, 3600, "seconds")}

    def __post_init__(self):
        c = _Checks("runtime")
        c.choice("kernels", self.kernels, ("auto", "plain"))
        c.choice("client_dealing", self.client_dealing, ("auto", "static"))
        known = ("tensorboard", "mlflow", "wandb")
        c.require(all(t in known for t in self.trackers) and len(set(self.trackers)) == len(self.trackers),
                  "trackers", list(self.trackers), f"must be a list of distinct names from {', '.join(known)}")
        c.choice("wire_dtype", self.wire_dtype, ("float32", "bfloat16", "float16"))
        c.require(isinstance(self.log_flush_s, (int, float)) and not isinstance(self.log_flush_s, bool)
                  and 0 <= self.log_flush_s <= 3600, "log_flush_s", self.log_flush_s,
                  "must be a number of seconds from 0 (every row at once) to 3600")
        if self.gather_memory is not None:
            try:
                parse_bytes(self.gather_memory)
            except ValueError as e:
                c.require(False, "gather_memory", self.gather_memory, str(e))
        c.require(self.threads is None or 1 <= self.threads <= MAX_THREADS, "threads", self.threads,
                  f"must be a positive integer up to {MAX_THREADS}, or null")
        if self.client_state_memory is not None:
            try:
                parse_bytes(self.client_state_memory)
            except ValueError as e:
                c.require(False, "client_state_memory", self.client_state_memory, str(e))
        if not c.errors:
            refuse_unused(c, self, "trackers", TRACKER_USES, "tracker", form=tuple(self.trackers))
        c.done()

    @property
    def gather_bytes(self):
        """`gather_memory` in bytes (None: sized from the machine, fedmpi.robust.chunks.default_budget)."""
        return None if self.gather_memory is None else parse_bytes(self.gather_memory)

    @property
    def client_state_bytes(self):
        """`client_state_memory` in bytes (None: no limit)."""
        return None if self.client_state_memory is None else parse_bytes(self.client_state_memory)
