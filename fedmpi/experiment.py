"""One FL experiment on one rank: the parts assembled, and one round opened and closed (DESIGN §5).

Every rank runs the same code; what a rank does in a round depends on its role. Parts, one job each:
  clients   ClientHost: placement, the clients' data on this rank's device, local training
  wire      RoundBuffers: the broadcast and reduction buffers and their device staging
  server    Server (rank 0): the global model, the server optimizer, evaluation, the round's figures
  protocol  how uploads travel (fedmpi.protocols: reduce, gather, route), chosen by the algorithm's family
No random choice is communicated: every rank derives the round's clients and each client's batches from
the seed. Construction does no collective after `node_local` and writes nothing, so a configuration
error found here (e.g. `Algorithm.check`) ends every rank the same way before any file is touched.
"""

from __future__ import annotations

import functools
import math
import os
import time

import torch

from fedmpi import rng, signals
from fedmpi.algorithms.base import SetupContext
from fedmpi.algorithms.registry import lookup
from fedmpi.algorithms.state import as_numpy_state
from fedmpi.clients import ClientHost
from fedmpi.data import load_dataset
from fedmpi.data.server_set import split_dataset
from fedmpi.data.stats import partition_stats
from fedmpi.flat import FlatModel
from fedmpi.models import build_model
from fedmpi.participation import build_participation
from fedmpi.protocols import PROTOCOLS
from fedmpi.runtime import pick_device, set_threads
from fedmpi.server import Server
from fedmpi.train import ServerTrainer
from fedmpi.uploads import build_stages
from fedmpi.wire import CMD_RUN, CMD_STOP, RoundBuffers


def build_partition(cfg, dataset, parts=None):
    """The server's set and the clients' index arrays, with their statistics for the run file under the
    group paths `partition` and `partition/server` (a `Split`); the same on every rank."""
    return split_dataset(cfg, dataset, parts)


class DeviceData:
    """The data set's tensors on this rank's device, moved there only when a part first needs them."""

    def __init__(self, dataset, device):
        self.dataset, self.device = dataset, device

    @functools.cached_property
    def train(self):
        ds = self.dataset
        return torch.from_numpy(ds.x_train).to(self.device), torch.from_numpy(ds.y_train).to(self.device)

    @functools.cached_property
    def test(self):
        ds = self.dataset
        return torch.from_numpy(ds.x_test).to(self.device), torch.from_numpy(ds.y_test).to(self.device)


class Experiment:
    def __init__(self, cfg, comm, *, dataset=None, model=None, parts=None, loss=None):
        """`dataset` (a fedmpi.data.Dataset), `model` (an nn.Module), `parts` (the clients' index arrays)
        and `loss` (a criterion on outputs and targets) replace what the config would build: the
        in-process API (`fedmpi.simulate`) passes them for custom experiments."""
        self.cfg, self.comm = cfg, comm
        local_rank, local_size, server_here = comm.node_local()      # the only collective of set-up
        computing = local_size - (1 if server_here and comm.size > 1 else 0)
        self.threads = set_threads(cfg.runtime.threads, computing)
        self.device = pick_device(cfg.runtime.device, local_rank)
        self.dataset = dataset if dataset is not None else load_dataset(cfg)
        self.split = build_partition(cfg, self.dataset, parts)
        if model is None:
            rng.seed_torch(cfg.seed, rng.INIT)     # every rank builds the same initial model, on the CPU
            model = build_model(cfg.model, self.dataset.input_shape, self.dataset.num_classes)
        self.flat = FlatModel(model, self.device)
        algo_cls = lookup(cfg.algorithm.name)
        algo_cls.check(cfg, self.flat)
        self.algo = algo = algo_cls.create(cfg, self.flat.dim, self.flat.n_params)
        x0 = self.flat.vec.detach().to("cpu", copy=True)
        sizes = [len(p) for p in self.split.parts]
        parts = algo.clients(self.split.parts, self.split.server_idx)
        if algo.shares_data:
            self.split.groups["partition/shared"] = partition_stats(self.dataset.y_train, parts,
                                                                   self.dataset.num_classes)
        data = DeviceData(self.dataset, self.device)
        self.clients = ClientHost(cfg, comm, algo, self.flat, parts, data, loss=loss)
        self.wire = RoundBuffers(comm, algo, self.flat.dim, len(parts), self.device, cfg.runtime.cuda_aware_mpi)
        probe = self.clients.probe_accuracy if self.clients.mine else None
        algo.setup(SetupContext(sizes, self.split.server_idx, x0, probe))
        algo.verify_declarations()
        self.server = None
        if comm.is_server:
            self.server = Server(cfg, algo, self.flat, x0, *data.test, loss=loss)
            self.server.start(self._server_trainer(data, loss))
        self.participation = build_participation(cfg, algo)
        self.stages = build_stages(cfg, algo, self.flat.dim)
        self.protocol = PROTOCOLS[algo.protocol](self)
        self._plans = {}
        self.start_round = 0
        # Stop requests: `stop_votes` (server) is the round's count of ranks asking to stop; once the run
        # loop sets `stopping`, the next broadcast carries CMD_STOP instead of starting that round.
        self.stop_votes, self.stopping = 0, False
        self.nonfinite = ""     # server: what was non-finite in the latest round ('' when all was finite)

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

    def global_model(self):
        """Server: the global flat vector as a float32 numpy array."""
        return self.server.x.detach().cpu().numpy()

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
        """The round's broadcast (header only unless `full`); every rank leaves here on a stop."""
        command = CMD_STOP if self.stopping else CMD_RUN
        fill = self.server.fill_down if self.server else None
        received, round_ = self.wire.broadcast(t, command, fill, full)
        if received == CMD_RUN and round_ != t:
            raise RuntimeError(f"rank {self.comm.rank} expected round {t}, server broadcast round {round_}: "
                               f"ranks out of step")
        if received == CMD_STOP:
            raise signals.stop_error(round_, self.stop_votes or None)

    def reduce(self, tally, sums=True):
        self.wire.reduce(tally, signals.requested(), sums)

    def close_round(self, plan, update=True, evaluate=None):
        """After the reduction: every rank tells the participation provider; the server updates (unless a
        FedSkip round inside a period), evaluates when due and returns the round's figures."""
        t = plan.round
        self.participation.done(plan)
        if not self.comm.is_server:
            return None
        server, stats = self.server, self.wire.stats()
        self.stop_votes = stats.stop_votes
        if update:
            sums, weight = self.wire.sums(), stats.weight
            for stage in self.stages:
                weight = stage.server(t, sums, weight)
            server.apply(t, sums, weight)
        metrics, clients = server.figures(t, plan.selected, stats, self.wire.client_figures(), self.num_clients)
        if server.eval_due(t) if evaluate is None else evaluate:
            metrics["test_acc"], metrics["test_loss"] = server.evaluate()
        metrics.update(self.algo.round_metrics())
        metrics.update(plan.metrics)
        clients.update(plan.columns)
        self.nonfinite = _nonfinite(metrics, stats, server.x)
        return metrics, clients


def _nonfinite(metrics, stats, x):
    """What of the round's outcome is non-finite: the training loss (where clients trained), the test loss
    (where evaluated), the global model; '' when all are finite."""
    found = []
    if stats.seen and not math.isfinite(metrics["train_loss"]):
        found.append(f"train_loss {metrics['train_loss']}")
    if "test_loss" in metrics and not math.isfinite(metrics["test_loss"]):
        found.append(f"test_loss {metrics['test_loss']}")
    if not bool(torch.isfinite(x).all()):
        found.append(f"{int((~torch.isfinite(x)).sum())} non-finite entries in the global model")
    return ", ".join(found)


def _inject_fault(rank, t):
    """Test aid: FEDMPI_INJECT_FAULT="RANK:ROUND" raises on that rank at the start of that round, so the
    failure path (one rank fails, the whole job ends, run.h5 says failed) can be exercised for real."""
    spec = os.environ.get("FEDMPI_INJECT_FAULT")
    if spec and spec == f"{rank}:{t}":
        raise RuntimeError(f"injected fault (FEDMPI_INJECT_FAULT={spec})")
    # Test aid: FEDMPI_ROUND_DELAY_S=SECONDS sleeps at the start of every round, so that a test can signal
    # or kill a rank mid-run without heavy training; results do not change (wall_s aside).
    delay = os.environ.get("FEDMPI_ROUND_DELAY_S")
    if delay:
        time.sleep(float(delay))
