"""One FL experiment on one rank: the parts assembled, and their state for checkpoints (docs/design.md §5).

Every rank runs the same code; what a rank does in a round depends on its role. Parts, one job each:
  clients   ClientHost: placement, the clients' data on this rank's device, local training
  wire      RoundBuffers: the broadcast and reduction buffers and their device staging
  server    Server (rank 0): the global model, the server optimizer, evaluation, the round's figures
  protocol  how uploads travel (fedmpi.round.protocols: reduce, gather, route, buffer), chosen by the algorithm's family
The round itself is fedmpi.round.engine.run_round over `round_parts`.
No random choice is communicated: every rank derives the round's clients and each client's batches from
the seed. Set-up measures, resolves and then builds (fedmpi.run.setup): by the time an Experiment is built,
fedmpi.run.resolve has accepted the config on this data set and model, so construction checks nothing.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch

from fedmpi.algorithms import algorithm_context
from fedmpi.algorithms.base import REDUCE, PlanHistory, SetupContext
from fedmpi.algorithms.state import ClientStateStore, as_numpy_state, bind_client_state
from fedmpi.attacks import record
from fedmpi.attacks.data import DataPoison, backdoor_test_set
from fedmpi.core import console
from fedmpi.core.personal import split_of
from fedmpi.core.train import ServerTrainer
from fedmpi.data.server_set import split_dataset
from fedmpi.data.stats import partition_stats
from fedmpi.robust.catalog import rule_class
from fedmpi.round.clients import ClientHost
from fedmpi.round.engine import RoundParts
from fedmpi.round.evaluation import SplitEvaluation
from fedmpi.round.local_eval import LocalEvaluation
from fedmpi.round.protocols import PROTOCOLS
from fedmpi.round.providers import build_participation, build_stages
from fedmpi.round.robust_checks import robust_active
from fedmpi.round.robust_setup import robust_protocol, robust_stage
from fedmpi.round.server import Server
from fedmpi.round.shadow import Shadow
from fedmpi.round.wire import RoundBuffers
from fedmpi.uploads.base import layout
from fedmpi.uploads.precision import WirePrecision


def build_partition(cfg, dataset, parts=None):
    """The server's set and the clients' index arrays, with their statistics for the run file under the
    group paths `partition` and `partition/server` (a `Split`); the same on every rank."""
    return split_dataset(dataset, cfg.partition, cfg.server_data, cfg.seed, cfg.eval.local_every, parts)


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
    def __init__(self, plan, comm, placement, dataset, split, flat, *, loss=None):
        """Builds this rank's parts from `plan` (fedmpi.run.resolve's RunPlan, checked) on the measured
        `placement` (fedmpi.run.setup), `dataset`, `split` (build_partition's) and `flat` (the initial model):
        straight-line assembly, no checks. `loss` (a criterion on outputs and targets) replaces the model's."""
        cfg = plan.cfg
        self.cfg, self.comm, self.plan = cfg, comm, plan
        self.node, self.workers, self.threads, self.device = (placement.node, placement.workers,
                                                              placement.threads, placement.device)
        self.dataset, self.split, self.flat = dataset, split, flat
        algo_cls = plan.algorithm
        split_entries = split_of(flat.entries, flat.dim, plan.personal) if plan.personal else None
        # The algorithm's context; who trained in round t is the participation provider's plan (bound below,
        # once the provider exists: it asks the algorithm which clients it selects).
        history = PlanHistory()
        self.algo = algo = algo_cls.create(cfg.algorithm, algorithm_context(cfg, flat.dim, flat.n_params, history,
                                                                            split_entries))
        x0 = flat.vec.detach().to("cpu", copy=True)
        sizes = [len(p) for p in split.parts]
        parts = algo.clients(split.parts, split.server_idx)
        if algo.shares_data:
            split.groups["partition/shared"] = partition_stats(dataset.y_train, parts, dataset.num_classes)
        data = DeviceData(dataset, self.device)
        # The attack (issue 25): the malicious set was drawn from the seed alone by resolve, the same on every rank.
        self.malicious = np.asarray(plan.malicious, dtype=np.int64)
        self.attack_note = plan.attack_note
        if self.attack_note and comm.is_server:
            console.say(f"fedmpi: warning: {self.attack_note}")
        poison = DataPoison(cfg.attack, self.malicious, cfg.seed, dataset.num_classes, dataset.x_train)
        self.stages = build_stages(cfg, algo, flat.dim, self.malicious)
        clip = robust_stage(cfg.server, cfg.attack.name, flat.dim)   # norm_bound under the plain reduction
        if clip is not None:
            self.stages.append(clip)
        if cfg.runtime.wire_dtype != "float32" and algo_cls.protocol == REDUCE:
            self.stages.append(WirePrecision(cfg.runtime.wire_dtype, flat.dim))    # last: what leaves
        # Per-client vectors (the algorithm's and the upload stages') in one store per rank, bounded in memory.
        self.client_store = ClientStateStore(cfg.runtime.client_state_bytes)
        bind_client_state(self.client_store, algo, *self.stages)
        self.clients = ClientHost(comm, self.workers, algo, flat, parts, data, seed=cfg.seed, client=cfg.client,
                                  client_rate=algo.context.client_rate, data=cfg.data, server=cfg.server,
                                  client_dealing=cfg.runtime.client_dealing, eval_batch=cfg.eval.batch_size, loss=loss,
                                  keeps_state=(algo.split is not None
                                               or any(stage.keeps_client_state for stage in self.stages)),
                                  poison=poison if poison.active else None)
        header_extra, up_extra = layout(self.stages, algo.up_vectors * flat.dim + algo.up_scalars)
        drift_columns = ("update_norm", "update_cosine") if cfg.eval.client_drift else ()
        drift_columns += ("robust_weight",) if clip is not None else ()
        self.wire = RoundBuffers(comm, algo, flat.dim, len(parts), self.device, cfg.runtime.cuda_aware_mpi,
                                 header_extra, up_extra, extra_columns=drift_columns,
                                 wire_dtype=cfg.runtime.wire_dtype)
        self.evaluation = SplitEvaluation(comm, flat, dataset.x_test, dataset.y_test,
                                          cfg.eval.batch_size, dataset.num_classes, data.tensor, loss=loss)
        # The backdoor's success rate: the triggered test set without the target class, split like the test set.
        self.backdoor = None
        if cfg.attack.name == "backdoor":
            x_bd, y_bd = backdoor_test_set(dataset.x_test, dataset.y_test, cfg.attack, poison.trigger)
            self.backdoor = SplitEvaluation(comm, flat, x_bd, y_bd, cfg.eval.batch_size,
                                            dataset.num_classes, data.tensor, loss=loss)
        self.data = data
        self.local_eval = (LocalEvaluation(cfg.eval, cfg.client, cfg.seed, comm, self.clients, algo, self.flat, data,
                                           self.split.local_test, self.client_store, loss=loss)
                           if cfg.eval.local_every is not None else None)
        probe = self.clients.probe_accuracy if self.clients.mine else None
        algo.setup(SetupContext(sizes, self.split.server_idx, x0, probe, model=self.flat))
        algo.verify_declarations()
        self.server = self.shadow = None
        if comm.is_server:
            self.server = Server(algo, self.flat, x0, server=cfg.server, rounds=cfg.rounds,
                                 client_rate=algo.context.client_rate, wire_dtype=cfg.runtime.wire_dtype)
            self.server.start(self._server_trainer(data, loss))
            if cfg.eval.divergence:
                self.shadow = Shadow(cfg, self.flat, self.server.x, *data.train, parts, loss=loss)
            for stage in self.stages:
                stage.on_server()
        self.participation = build_participation(cfg, algo, [len(p) for p in parts])
        history.bind(self.participation.plan)
        trainer = (self._fltrust_trainer(data, loss)
                   if comm.is_server and robust_active(cfg.server.aggregator, cfg.attack.name)
                   and rule_class(cfg.server.aggregator).needs_server_update else None)
        protocol = robust_protocol(len(parts), trainer, server=cfg.server, attack=cfg.attack, seed=cfg.seed,
                                   gather_bytes=cfg.runtime.gather_bytes, client=cfg.client,
                                   client_rate=algo.context.client_rate) or PROTOCOLS[algo.protocol]
        # What a round works with (fedmpi.round.engine.run_round): the parts above, the protocol and its state.
        self.round_parts = RoundParts(
            algo=algo, clients=self.clients, wire=self.wire, server=self.server, participation=self.participation,
            stages=tuple(self.stages), evaluation=self.evaluation, shadow=self.shadow,
            client_store=self.client_store, comm=comm, timer=comm.timer, flat=self.flat,
            test_set=lambda: data.test, protocol=protocol,
            state=protocol.new_state(len(parts), cfg.eval.client_drift), rounds=cfg.rounds,
            eval_every=cfg.eval.every, eval_batch=cfg.eval.batch_size, client_drift=cfg.eval.client_drift,
            local_eval=self.local_eval, backdoor=self.backdoor)

    def _server_trainer(self, data, loss):
        if not (self.algo.uses_server_set and len(self.split.server_idx)):
            return None
        idx = torch.from_numpy(self.split.server_idx).to(self.device)
        return ServerTrainer(self.flat, self.cfg.client, *data.train, idx, self.cfg.seed, loss=loss, test=data.test,
                             eval_batch=self.cfg.eval.batch_size)

    def _fltrust_trainer(self, data, loss):
        """FLTrust's server update trains on the server's set (check_robust made sure there is one)."""
        idx = torch.from_numpy(self.split.server_idx).to(self.device)
        return ServerTrainer(self.flat, self.cfg.client, *data.train, idx, self.cfg.seed, loss=loss)

    # -- what the run loop and checkpoints see ---------------------------------------------------------
    @property
    def num_clients(self):
        return len(self.clients.parts)

    @property
    def partition_groups(self):
        """/partition, /partition/server (and /partition/shared) datasets for the run file; /attack (the
        malicious ids, the attack's keys as attributes) when an attack is configured."""
        groups = dict(self.split.groups)
        if not self.cfg.attack.inert:
            groups["attack"] = record(self.cfg.attack, self.malicious)
        return groups

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
        attrs = {"attack_note": self.attack_note} if self.attack_note else {}
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

