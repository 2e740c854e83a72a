"""One FL experiment on one rank: the parts assembled, and one round opened and closed (docs/design.md §5).

Every rank runs the same code; what a rank does in a round depends on its role. Parts, one job each:
  clients   ClientHost: placement, the clients' data on this rank's device, local training
  wire      RoundBuffers: the broadcast and reduction buffers and their device staging
  server    Server (rank 0): the global model, the server optimizer, evaluation, the round's figures
  protocol  how uploads travel (fedmpi.round.protocols: reduce, gather, route), chosen by the algorithm's family
No random choice is communicated: every rank derives the round's clients and each client's batches from
the seed. Construction does no collective after `node_local` and writes nothing, so a configuration
error found here (e.g. `Algorithm.check`) ends every rank the same way before any file is touched.
"""

from __future__ import annotations

import functools
import math
import os
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.algorithms import algorithm_context
from fedmpi.algorithms.base import REDUCE, PlanHistory, SetupContext
from fedmpi.algorithms.registry import lookup
from fedmpi.algorithms.state import ClientStateStore, as_numpy_state, bind_client_state
from fedmpi.core import rng
from fedmpi.core.flat import FlatModel
from fedmpi.core.models import build_model, check_takes
from fedmpi.core.train import ServerTrainer
from fedmpi.data.server_set import split_dataset
from fedmpi.data.shared import load_shared
from fedmpi.data.stats import partition_stats
from fedmpi.mpi import signals
from fedmpi.mpi.runtime import pick_device, set_deterministic, set_threads
from fedmpi.round.clients import ClientHost
from fedmpi.round.evaluation import SplitEvaluation
from fedmpi.round.protocols import PROTOCOLS
from fedmpi.round.providers import build_participation, build_stages
from fedmpi.round.server import Server
from fedmpi.round.shadow import Shadow
from fedmpi.round.wire import CMD_RUN, CMD_STOP, HEADER, RoundBuffers
from fedmpi.uploads.base import layout


def build_partition(cfg, dataset, parts=None):
    """The server's set and the clients' index arrays, with their statistics for the run file under the
    group paths `partition` and `partition/server` (a `Split`); the same on every rank."""
    return split_dataset(cfg, dataset, parts)


class DeviceData:
    """The data set's tensors on this rank's device, made only when a part first needs them. On the CPU they
    are views of the (node-shared, read-only) arrays: nothing is copied, and a rank's memory holds only the
    pages it reads. On a GPU the training set is copied to each rank's device whole (any client may train
    there); the test set only for the server's shadow model, the evaluation takes its own batches."""

    def __init__(self, dataset, device):
        self.dataset, self.device = dataset, device

    def tensor(self, array):
        """`array` (a numpy array or a slice of one) as a tensor on this rank's device."""
        with warnings.catch_warnings():
            # The node's shared arrays are read-only; fedmpi only ever reads the tensors made from them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(array).to(self.device)

    @functools.cached_property
    def train(self):
        return self.tensor(self.dataset.x_train), self.tensor(self.dataset.y_train)

    @functools.cached_property
    def test(self):
        return self.tensor(self.dataset.x_test), self.tensor(self.dataset.y_test)


class Experiment:
    def __init__(self, cfg, comm, *, dataset=None, model=None, parts=None, loss=None):
        """`dataset` (a fedmpi.data.Dataset), `model` (an nn.Module), `parts` (the clients' index arrays)
        and `loss` (a criterion on outputs and targets) replace what the config would build: the
        in-process API (`fedmpi.simulate`) passes them for custom experiments."""
        self.cfg, self.comm = cfg, comm
        gpus = torch.cuda.device_count() if cfg.runtime.device != "cpu" else 0
        self.node = node = comm.node_local(gpus)      # with the data's sharing, the only collectives of set-up
        # The node's ranks share one copy of the data set (collective over the node, before anything here
        # can fail on one rank alone).
        self.dataset = dataset if dataset is not None else load_shared(cfg, comm)
        self.workers = _workers(cfg, comm, node)
        computing = node.local_size - (1 if node.server_here and 0 not in self.workers else 0)
        self.threads = set_threads(cfg.runtime.threads, computing, node.cores)
        set_deterministic(cfg.runtime.deterministic)      # before the device's first kernels
        self.device = pick_device(cfg.runtime.device, node.local_rank)
        self.split = build_partition(cfg, self.dataset, parts)
        if model is None:
            rng.seed_torch(cfg.seed, rng.INIT)     # every rank builds the same initial model, on the CPU
            model = build_model(cfg.model, self.dataset.input_shape, self.dataset.num_classes)
            check_takes(model, cfg, self.dataset.x_train, self.dataset.num_classes)   # before any file is written
        self.flat = FlatModel(model, self.device)
        algo_cls = lookup(cfg.algorithm.name)
        algo_cls.check(cfg, self.flat)
        # The algorithm's context: who trained in round t is the participation provider's plan (built below)
        history = PlanHistory(self.plan)
        self.algo = algo = algo_cls.create(cfg.algorithm, algorithm_context(cfg, self.flat.dim, self.flat.n_params,
                                                                            history))
        x0 = self.flat.vec.detach().to("cpu", copy=True)
        sizes = [len(p) for p in self.split.parts]
        parts = algo.clients(self.split.parts, self.split.server_idx)
        if algo.shares_data:
            self.split.groups["partition/shared"] = partition_stats(self.dataset.y_train, parts,
                                                                   self.dataset.num_classes)
        data = DeviceData(self.dataset, self.device)
        self.stages = build_stages(cfg, algo, self.flat.dim)
        # Per-client vectors (the algorithm's and the upload stages') in one store per rank, bounded in memory.
        self.client_store = ClientStateStore(cfg.runtime.client_state_bytes)
        bind_client_state(self.client_store, algo, *self.stages)
        self.clients = ClientHost(cfg, comm, self.workers, algo, self.flat, parts, data, loss=loss,
                                  keeps_state=any(stage.keeps_client_state for stage in self.stages))
        header_extra, up_extra = layout(self.stages, algo.up_vectors * self.flat.dim + algo.up_scalars)
        drift_columns = ("update_norm", "update_cosine") if cfg.eval.client_drift else ()
        self.wire = RoundBuffers(comm, algo, self.flat.dim, len(parts), self.device, cfg.runtime.cuda_aware_mpi,
                                 header_extra, up_extra, extra_columns=drift_columns)
        self.evaluation = SplitEvaluation(comm, self.flat, self.dataset.x_test, self.dataset.y_test,
                                          cfg.eval.batch_size, self.dataset.num_classes, data.tensor, loss=loss)
        self.data = data
        probe = self.clients.probe_accuracy if self.clients.mine else None
        algo.setup(SetupContext(sizes, self.split.server_idx, x0, probe))
        algo.verify_declarations()
        self.server = self.shadow = None
        if comm.is_server:
            self.server = Server(cfg, algo, self.flat, x0)
            self.server.start(self._server_trainer(data, loss))
            if cfg.eval.divergence:
                self.shadow = Shadow(cfg, self.flat, self.server.x, *data.train, parts, loss=loss)
            for stage in self.stages:
                stage.on_server()
        self.participation = build_participation(cfg, algo, [len(p) for p in parts])
        self.protocol = PROTOCOLS[algo.protocol](self)
        self._plans = {}
        self.start_round = 0
        # Stop requests: `stop_votes` (server) is the round's count of ranks asking to stop; once the run
        # loop sets `stopping`, the next broadcast carries CMD_STOP instead of starting that round.
        self.stop_votes, self.stopping = 0, False
        self.nonfinite = ""     # server: what was non-finite in the latest round ('' when all was finite)
        self.after_broadcast = None     # server: called right after each broadcast (the run loop's deferred row)

    def _server_trainer(self, data, loss):
        if not (self.algo.uses_server_set and len(self.split.server_idx)):
            return None
        idx = torch.from_numpy(self.split.server_idx).to(self.device)
        return ServerTrainer(self.flat, self.cfg.client, *data.train, idx, self.cfg.seed, loss=loss, test=data.test,
                             eval_batch=self.cfg.eval.batch_size)

    # -- what the run loop and checkpoints see ---------------------------------------------------------
    @property
    def first_round(self):
        """The first round this process runs (0, or the round after the checkpoint it resumed from)."""
        return self.start_round

    @property
    def num_clients(self):
        return len(self.clients.parts)

    @property
    def partition_groups(self):
        """/partition, /partition/server (and /partition/shared) datasets for the run file."""
        return dict(self.split.groups)

    @property
    def metric_attrs(self):
        """Attributes of /metrics datasets: per-class test counts, the divergence's layer names."""
        attrs = {"class_acc": {"class_counts": self.evaluation.class_counts}}
        if self.shadow is not None:
            attrs["weight_divergence_layers"] = {"layers": self.shadow.layers}
        return attrs

    def global_model(self):
        """Server: the global flat vector as a float32 numpy array."""
        return self.server.x.detach().cpu().numpy()

    def run_attrs(self) -> dict:
        """Server: what the upload stages record as run.h5 attributes (e.g. the noise multiplier)."""
        attrs = {}
        for stage in self.stages:
            attrs.update(stage.attrs())
        return attrs

    def state_dict(self) -> dict:
        """Server: the global model, the algorithm's server state, the optimizer's, the participation
        provider's and the upload stages', as numpy arrays (one group each in a checkpoint)."""
        state = self.server.state_dict()
        state["participation"] = self.participation.state()
        for stage in self.stages:
            state[f"stage_{stage.name}"] = stage.state()
        return {k: (v if k == "global" else as_numpy_state(v)) for k, v in state.items()}

    def load_state_dict(self, state: dict):
        self.server.load_state_dict(state)
        self.participation.load_state(state.get("participation", {}))
        for stage in self.stages:
            stage.load_state(state.get(f"stage_{stage.name}", {}))

    def client_state(self, cid) -> dict:
        """Hosting rank: client `cid`'s state (the algorithm's and the upload stages') as numpy arrays."""
        state = self.algo.client_state(cid)
        for stage in self.stages:
            state.update(stage.client_state(cid))
        return as_numpy_state(state)

    def load_client_state(self, cid, state: dict):
        self.algo.load_client_state(cid, state)
        for stage in self.stages:
            stage.load_client_state(cid, state)

    # -- one round -----------------------------------------------------------------------------------------
    def run_round(self, t):
        """One round on this rank; on the server returns (metrics, per-client figures)."""
        _inject_fault(self.comm.rank, t)
        return self.protocol(t)

    def plan(self, t):
        """Round t's RoundPlan (who trains, whose update counts) — the same on every rank; kept for the
        current and the previous round (FedSkip routes slots from the previous round's clients)."""
        if t not in self._plans:
            self._plans = {k: v for k, v in self._plans.items() if k >= t - 1}
            self._plans[t] = self.participation.plan(t)
        return self._plans[t]

    def open_round(self, t, full=True):
        """The round's broadcast (header only unless `full`); every rank leaves here on a stop. Rank 0 then
        trains the divergence shadow while the workers train their clients."""
        command = CMD_STOP if self.stopping else CMD_RUN
        self.wire.start_round(self.plan(t).selected)
        fill = self.server.fill_down if self.server else None
        extra = self._header_extra() if self.server and self.wire.header_len > HEADER else ()
        received, round_ = self.wire.broadcast(t, command, fill, full, extra)
        if received == CMD_RUN and round_ != t:
            raise RuntimeError(f"rank {self.comm.rank} expected round {t}, server broadcast round {round_}: "
                               f"ranks out of step")
        if received == CMD_STOP:
            raise signals.stop_error(round_, self.stop_votes or None)
        if self.server and self.after_broadcast:
            with self.timer.phase("server"):
                self.after_broadcast()
        if self.wire.header_len > HEADER:
            values = self.wire.header_values()
            for stage in self.stages:
                stage.receive(values[stage.header_offset: stage.header_offset + stage.header_size])
        if self.shadow is not None:
            with self.timer.phase("train"):
                self.shadow.train_round(t, self.plan(t).selected)

    def _header_extra(self):
        """Server: the upload stages' header values for the round's broadcast."""
        return [float(v) for stage in self.stages for v in stage.header()]

    def stage_scalars(self, run, acc):
        """Worker, after a counted client's `accumulate`: the stages' per-client sums into `acc`."""
        for stage in self.stages:
            for i, value in enumerate(stage.scalars(run)):
                acc[stage.up_offset + i] += value

    def reduce(self, tally, sums=True):
        self.wire.reduce(tally, signals.requested(), sums)

    def eval_due(self, t):
        return (t + 1) % self.cfg.eval.every == 0 or t + 1 == self.cfg.rounds

    def close_round(self, plan, update=True, evaluate=None, drift=None):
        """After the reduction, on every rank: the participation provider hears of it; the server updates
        (unless a FedSkip round inside a period); when due every rank evaluates its share of the test set;
        with eval.client_drift the clients' cosines are measured; the server returns the round's record."""
        t, server = plan.round, self.server
        self.participation.done(plan)
        self.client_store.end_round()       # the round's client vectors back to host memory (or the spill file)
        stats = sums = None
        if server:
            with self.timer.phase("server"):
                stats = self.wire.stats()
                self.stop_votes = stats.stop_votes
                sums, weight = self.wire.sums(), stats.weight
                if update:
                    for stage in self.stages:
                        weight = stage.server(t, sums, weight)
                    server.apply(t, sums, weight)
        evaluated = None
        if self.eval_due(t) if evaluate is None else evaluate:
            with self.timer.phase("eval"):
                evaluated = self.evaluation.run(self.wire.share(server.x if server else None))
        cosines = drift.cosines(self, sums, stats) if drift is not None else None
        if not server:
            return None
        with self.timer.phase("server"):
            record = self._record(plan, stats, sums, evaluated, cosines)
        record.timing[0] += self.timer.take()     # the server's own time after the reduction
        return record

    def _record(self, plan, stats, sums, evaluated, cosines):
        """The round's row of /metrics, /clients and /timing."""
        t, server = plan.round, self.server
        metrics, clients = server.figures(t, plan.selected, stats, self.wire.client_figures(), self.num_clients)
        if stats.weight > 0 and self.algo.protocol == REDUCE:
            head = sums[: self.flat.dim]
            metrics["update_sq_norm"] = stats.update_sq / stats.weight
            metrics["aggregate_sq_norm"] = float(torch.dot(head, head)) / stats.weight ** 2
            metrics["gradient_diversity"] = metrics["update_sq_norm"] / max(metrics["aggregate_sq_norm"], 1e-300)
        if evaluated is not None:
            metrics["test_acc"], metrics["test_loss"], metrics["class_acc"] = evaluated
        if cosines is not None:
            clients["update_cosine"][plan.selected] = cosines[plan.selected]
        if self.shadow is not None:
            metrics["weight_divergence"], metrics["weight_divergence_layers"] = self.shadow.divergence(server.x)
            if evaluated is not None:
                metrics["shadow_acc"] = self.shadow.accuracy(*self.data.test, self.cfg.eval.batch_size)
        metrics.update(self.algo.round_metrics())
        metrics.update(plan.metrics)
        for stage in self.stages:
            metrics.update(stage.round_metrics(t))
        clients.update(plan.columns)
        self.nonfinite = _nonfinite(metrics, stats, server.x)
        return RoundRecord(metrics, clients, self.wire.timing(), server.x)

    @property
    def timer(self):
        return self.comm.timer


@dataclass
class RoundRecord:
    """What the server logs for a round: /metrics (name -> value, or a row for [round, k] figures),
    /clients (name -> [num_clients] row) and /timing ([rank, phase] seconds)."""

    metrics: dict
    clients: dict
    timing: np.ndarray
    model: torch.Tensor = None      # the global model after the round; its fingerprint is taken when logged


def _workers(cfg, comm, node):
    """The ranks that train clients: 1..P-1, plus rank 0 with `server.trains_clients` (null: when rank 0's
    node is a CPU node with a core its other ranks leave idle, e.g. -n 2 on two cores)."""
    if comm.size == 1:
        return comm.workers
    trains = cfg.server.trains_clients
    if trains is None:
        trains = node.server_spare_core()
    return tuple(range(comm.size)) if trains else tuple(range(1, comm.size))


def _nonfinite(metrics, stats, x):
    """What of the round's outcome is non-finite: the training loss (where clients trained), the test loss
    (where evaluated), the global model; '' when all are finite."""
    found = []
    if stats.seen and not math.isfinite(metrics["train_loss"]):
        found.append(f"train_loss {metrics['train_loss']}")
    if "test_loss" in metrics and not math.isfinite(metrics["test_loss"]):
        found.append(f"test_loss {metrics['test_loss']}")
    # The float64 sum of float32 values cannot overflow, so it is finite exactly when every entry is: one pass
    # without a mask the size of the model.
    if not math.isfinite(float(x.sum(dtype=torch.float64))):
        found.append(f"{int((~torch.isfinite(x)).sum())} non-finite entries in the global model")
    return ", ".join(found)


def _inject_fault(rank, t):
    """Test aid: FEDMPI_INJECT_FAULT="RANK:ROUND" raises on that rank at the start of that round, so the
    failure path (one rank fails, the whole job ends, run.h5 says failed) can be exercised for real;
    "RANK:ROUND:memory" raises a MemoryError instead (a rank out of memory)."""
    spec = os.environ.get("FEDMPI_INJECT_FAULT")
    if spec and spec.startswith(f"{rank}:{t}") and spec[len(f"{rank}:{t}"):] in ("", ":memory"):
        if spec.endswith(":memory"):
            raise MemoryError(f"injected: unable to allocate (FEDMPI_INJECT_FAULT={spec})")
        raise RuntimeError(f"injected fault (FEDMPI_INJECT_FAULT={spec})")
    # Test aid: FEDMPI_ROUND_DELAY_S=SECONDS sleeps at the start of every round, so that a test can signal
    # or kill a rank mid-run without heavy training; results do not change (wall_s aside).
    delay = os.environ.get("FEDMPI_ROUND_DELAY_S")
    if delay:
        time.sleep(float(delay))
