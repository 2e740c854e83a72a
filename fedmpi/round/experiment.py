"""One FL experiment on one rank: its parts built in a straight line from the RunPlan (docs/explanation/design.md §5),
and what the run loop and checkpoints read of them.

Set-up measures, resolves and then builds (fedmpi.run.setup): by the time `build` runs, fedmpi.run.resolve
has accepted the config on this data set and model, so nothing here checks anything. This module is the one
place in fedmpi.round that reads the whole config: every part is handed its own sections and values (the
upload stages and participation providers the sections they declare they read, `_given`). The round itself
is fedmpi.round.engine.run_round over the RoundParts `build` returns. No random choice is communicated:
every rank derives the round's clients and each client's batches from the seed.
"""

from __future__ import annotations

import numpy as np

from fedmpi.algorithms import algorithm_context
from fedmpi.algorithms.base import PlanHistory, SetupContext
from fedmpi.algorithms.state import ClientStateStore, as_numpy_state, bind_client_state
from fedmpi.attacks import record
from fedmpi.attacks.data import DataPoison, backdoor_test_set
from fedmpi.core import console, shared_base
from fedmpi.core.perplexity import records_perplexity
from fedmpi.core.personal import split_of
from fedmpi.counterfactual.plans import counterfactual_plans
from fedmpi.data.server_set import split_dataset
from fedmpi.data.stats import partition_stats
from fedmpi.plans.base import ProviderSetting
from fedmpi.robust.catalog import rule_class
from fedmpi.round.assembly import build_observers, build_transport, server_trainer
from fedmpi.round.clients import ClientHost
from fedmpi.round.device_data import DeviceData
from fedmpi.round.engine import RoundParts
from fedmpi.round.evaluation import SplitEvaluation, eval_subset
from fedmpi.round.local_eval import LocalEvaluation
from fedmpi.round.providers import PROVIDERS, STAGES, build_participation, build_stages
from fedmpi.round.robust_setup import gather_settings
from fedmpi.round.server import Server
from fedmpi.round.shadow import Shadow
from fedmpi.round.wire import RoundBuffers
from fedmpi.uploads.base import StageSetting, UploadPath

__all__ = ["DeviceData", "Experiment", "build", "build_partition"]


def _given(cfg, classes) -> dict:
    """{class: the sections (and top-level values) of `cfg` it declares it reads, by name}: what each stage or
    provider is built from (fedmpi.round.providers), and all of the config it sees."""
    return {cls: {name: getattr(cfg, name) for name in cls.reads} for cls in classes}


def build_partition(cfg, dataset, parts=None):
    """The server's set and the clients' index arrays, with their statistics for the run file under the
    group paths `partition` and `partition/server` (a `Split`); the same on every rank."""
    return split_dataset(dataset, cfg.partition, cfg.server_data, cfg.seed, cfg.eval.local_every, parts)


def build(plan, comm, placement, dataset, split, flat, data, loss=None) -> RoundParts:
    """This rank's parts of `plan` (fedmpi.run.resolve's RunPlan) on the measured `placement`, `dataset`, `split`
    (build_partition's), `flat` (the initial model) and `data` (its DeviceData); `loss` replaces the model's
    criterion. Each part is made once, from parts already made and its own sections."""
    cfg, server_rank, n = plan.cfg, comm.is_server, flat.dim
    personal = split_of(flat.entries, n, plan.personal) if plan.personal else None
    # Who trained in round t is the participation provider's plan, which asks the algorithm whom it selects:
    # the algorithm's history is bound to the provider once both exist (below).
    history = PlanHistory()
    algo = plan.algorithm.create(cfg.algorithm, algorithm_context(cfg, n, flat.n_params, history, personal))
    x0, rate = flat.vec.detach().to("cpu", copy=True), algo.context.client_rate
    parts = algo.clients(split.parts, split.server_idx)
    if algo.shares_data:
        split.groups["partition/shared"] = partition_stats(dataset.y_train, parts, dataset.num_classes)
    if plan.attack_note and server_rank:
        console.say(f"fedmpi: warning: {plan.attack_note}")
    malicious = np.asarray(plan.malicious, dtype=np.int64)      # drawn from the seed alone by resolve
    poison = DataPoison(cfg.attack, malicious, cfg.seed, dataset.num_classes, dataset.x_train)
    setting = StageSetting(algo, n, plan.malicious, server_rank, tuple(len(p) for p in parts))
    stages = build_stages(setting, _given(cfg, STAGES + plan.plugin_stages))
    path = UploadPath(stages, algo.up_vectors * n + algo.up_scalars)
    # Per-client vectors (the algorithm's and the upload stages') in one store per rank, bounded in memory.
    store = ClientStateStore(cfg.runtime.client_state_bytes)
    bind_client_state(store, algo, *stages)
    clients = ClientHost(comm, placement.workers, algo, flat, parts, data, seed=cfg.seed, client=cfg.client,
                         client_rate=rate, data=cfg.data, server=cfg.server, client_dealing=cfg.runtime.client_dealing,
                         eval_batch=cfg.eval.batch_size, loss=loss, poison=poison if poison.active else None,
                         keeps_state=algo.split is not None or path.keeps_client_state)
    columns = ("update_norm", "update_cosine") if cfg.eval.client_drift else ()
    columns += tuple(name for stage in stages for name in stage.columns)
    wire = RoundBuffers(comm, algo, n, len(parts), placement.device, cfg.runtime.cuda_aware_mpi, path.layout.header_len,
                        path.layout.up_extra, extra_columns=columns, wire_dtype=cfg.runtime.wire_dtype)
    # eval.max_samples: every evaluation (and the backdoor's) on one fixed, seeded subsample of the test set.
    kept = eval_subset(len(dataset.y_test), cfg.eval.max_samples, cfg.seed)
    x_test, y_test = (dataset.x_test, dataset.y_test) if kept is None else (dataset.x_test[kept], dataset.y_test[kept])
    evaluation = SplitEvaluation(comm, flat, x_test, y_test, cfg.eval.batch_size, dataset.num_classes, data.tensor,
                                 loss=loss)
    local_eval = (LocalEvaluation(cfg.eval, cfg.client, cfg.seed, comm, clients, algo, flat, data, split.local_test,
                                  store, loss=loss) if cfg.eval.local_every is not None else None)
    algo.setup(SetupContext([len(p) for p in split.parts], split.server_idx, x0,
                            clients.probe_accuracy if clients.mine else None, model=flat))
    algo.verify_declarations()
    server = shadow = fltrust = None
    if server_rank:
        server = Server(algo, flat, x0, server=cfg.server, rounds=cfg.rounds, client_rate=rate,
                        wire_dtype=cfg.runtime.wire_dtype)
        server.start(server_trainer(flat, data, split.server_idx if algo.uses_server_set else None,
                                    client=cfg.client, seed=cfg.seed, loss=loss, evaluated=cfg.eval.batch_size))
        if cfg.eval.divergence:
            shadow = Shadow(flat, server.x, *data.train, parts, client=cfg.client, seed=cfg.seed, client_rate=rate,
                            test_set=lambda: data.test, eval_batch=cfg.eval.batch_size, loss=loss)
        if plan.robust and rule_class(cfg.server.aggregator).needs_server_update:
            fltrust = server_trainer(flat, data, split.server_idx, client=cfg.client, seed=cfg.seed, loss=loss)
    participation = build_participation(ProviderSetting(algo, tuple(len(p) for p in parts)), _given(
        cfg, ((plan.plugin_provider,) if plan.plugin_provider else ()) + PROVIDERS))
    participation = counterfactual_plans(participation, cfg.counterfactual, seed=cfg.seed, num_clients=len(parts),
                                         clients_per_round=cfg.server.clients_per_round)
    history.bind(participation.plan)
    gather = gather_settings(len(parts), fltrust, server=cfg.server, attack=cfg.attack, seed=cfg.seed,
                             gather_bytes=cfg.runtime.gather_bytes, client=cfg.client, client_rate=rate)
    transport = build_transport(algo, clients, wire, path, participation=participation, comm=comm, server=server,
                                gather=gather, client_drift=cfg.eval.client_drift)
    # The backdoor's success rate: the triggered test set without the target class, split like the test set.
    triggered = None
    if cfg.attack.name == "backdoor":
        x_bd, y_bd = backdoor_test_set(x_test, y_test, cfg.attack, poison.trigger)
        triggered = SplitEvaluation(comm, flat, x_bd, y_bd, cfg.eval.batch_size, dataset.num_classes, data.tensor,
                                    loss=loss)
    return RoundParts(algo=algo, clients=clients, wire=wire, server=server, participation=participation, stages=path,
                      evaluation=evaluation, client_store=store, comm=comm, timer=comm.timer, flat=flat,
                      transport=transport, rounds=cfg.rounds, eval_every=cfg.eval.every, local_eval=local_eval,
                      observers=build_observers(transport, n, shadow, triggered),
                      perplexity=records_perplexity(dataset.name, cfg.model.name, custom_loss=loss is not None))


class Experiment:
    def __init__(self, plan, comm, placement, dataset, split, flat, *, loss=None):
        """This rank's experiment of `plan` (`build`'s arguments; `loss` replaces the model's criterion)."""
        self.cfg, self.plan, self.comm, self.dataset, self.split, self.flat = plan.cfg, plan, comm, dataset, split, flat
        self.node, self.workers, self.threads, self.device = (placement.node, placement.workers, placement.threads,
                                                              placement.device)
        self.data = DeviceData(dataset, placement.device)
        self.round_parts = p = build(plan, comm, placement, dataset, split, flat, self.data, loss)
        self.algo, self.clients, self.server, self.participation = p.algo, p.clients, p.server, p.participation
        self.wire, self.evaluation, self.client_store = p.wire, p.evaluation, p.client_store
        self.stages, self.observers = list(p.stages), p.observers
        self.malicious, self.attack_note = np.asarray(plan.malicious, dtype=np.int64), plan.attack_note
        self.test_indices = eval_subset(len(dataset.y_test), plan.cfg.eval.max_samples, plan.cfg.seed)   # as `build`

    # -- what the run loop and checkpoints see ---------------------------------------------------------
    @property
    def num_clients(self):
        return len(self.clients.parts)

    @property
    def partition_groups(self):
        """/partition, /partition/server (and /partition/shared) datasets for the run file; /attack (the
        malicious ids, the attack's keys as attributes) when an attack is configured; /eval/test_indices (the
        global test samples every evaluation used) with eval.max_samples."""
        groups = dict(self.split.groups)
        if not self.cfg.attack.inert:
            groups["attack"] = record(self.cfg.attack, self.malicious)
        if self.test_indices is not None:       # eval.max_samples: which test samples every evaluation used
            groups["eval"] = {"test_indices": self.test_indices}
        return groups

    @property
    def metric_attrs(self):
        """Attributes of /metrics datasets: per-class test counts, the observers' (the divergence's layers)."""
        attrs = {"class_acc": {"class_counts": self.evaluation.class_counts}}
        for observer in self.observers:
            attrs.update(observer.metric_attrs())
        return attrs

    def global_model(self):
        """Server: the global flat vector as a float32 numpy array."""
        return self.server.x.detach().cpu().numpy()

    def run_attrs(self) -> dict:
        """Server: what the upload stages record as run.h5 attributes (e.g. the noise multiplier)."""
        attrs = {"attack_note": self.attack_note} if self.attack_note else {}
        for stage in self.stages:
            attrs.update(stage.attrs())
        base = getattr(self.flat.module, shared_base.MODULE_ATTR, "")    # a frozen base's hash (set-up's)
        if base:
            attrs[shared_base.RUN_ATTR] = base
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
