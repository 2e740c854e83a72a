"""Resolve, then build (docs/explanation/design.md §5): a config, with the shapes of the data set and the model it
runs on, becomes a checked `RunPlan`, or one ConfigError listing every problem at once.

`resolve` is the only validation a run makes of how its components combine: set-up (fedmpi.round.experiment)
calls it on every rank with the shapes it measured, before anything is written; `--dry-run` calls it with the
same shapes; the fuzz suite reaches it through both. It is pure (no MPI, no torch: importing it or calling it
leaves torch unimported; no files but unlearning.original's recorded update norms, for FedEraser's checks)
and asks each selected component for its own problems through the
declarations it registered (the algorithm class's `check` and `personal_patterns`, the attack's, the
aggregator's and the server optimizer's catalogs, the deployment, privacy, secure-aggregation and
wire-precision rules). The config's sections check their own ranges when the config is built
(fedmpi.config); loading the data set and building the model refuse what they cannot load or build. What
resolve leaves to the ranks is what only a node can know: its devices, its cores, its memory.
"""

from __future__ import annotations

import dataclasses

from fedmpi.algorithms import personal_entries
from fedmpi.algorithms.registry import lookup
from fedmpi.attacks import checks as attack_checks
from fedmpi.attacks import malicious_clients, no_malicious_note
from fedmpi.core.errors import ConfigError
from fedmpi.core.model_shape import ModelShape, takes_problems
from fedmpi.counterfactual.checks import problems as counterfactual_problems
from fedmpi.data.data_shape import DataShape
from fedmpi.deploy.checks import check as deploy_check
from fedmpi.deploy.keys import ClientsConfig
from fedmpi.plans import catalog as provider_catalog
from fedmpi.privacy import accounting
from fedmpi.privacy.plan import stage_problems as privacy_problems
from fedmpi.privacy.sampling import PoissonSampling
from fedmpi.round.robust_checks import check_robust, robust_active
from fedmpi.round.server_opt import check_optimizer
from fedmpi.secagg.checks import problems as secagg_problems
from fedmpi.unlearning import federaser
from fedmpi.uploads import catalog as stage_catalog
from fedmpi.uploads import record as update_record
from fedmpi.uploads.catalog import section_names
from fedmpi.uploads.precision import problems as wire_problems


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What set-up builds, decided: the config with the shapes it was checked against, and every choice the
    build step would otherwise make again from the config."""

    cfg: object
    data: DataShape
    model: ModelShape
    algorithm: type            # the class that runs (Algorithm.form of algorithm.name's class)
    personal: tuple            # the names of the model's personal entries (() when nothing is personal)
    num_clients: int           # the clients the algorithm trains (central: 1)
    malicious: tuple           # the attack's client ids (() without an attack)
    attack_note: str | None    # the warning of an attack with no malicious client, recorded in the run file
    robust: bool               # server.aggregator or an omniscient attack: the robust path is set up
    custom_loss: bool = False  # the in-process API's own criterion (clients then train one by one)
    plugin_stages: tuple = ()  # the upload stage classes uploads.stages names, loaded and checked
    plugin_provider: type | None = None     # the provider class participation.name names, loaded and checked


def resolve(cfg, data: DataShape, model: ModelShape, *, custom_loss=False) -> RunPlan:
    """The checked plan of `cfg` on this data set and model; ConfigError with every problem otherwise."""
    found, plan = _resolve(cfg, data, model, custom_loss)
    if found:
        raise ConfigError(_unique(found))
    return plan


def problems(cfg, data: DataShape, model: ModelShape, *, custom_loss=False) -> list:
    """Every problem `resolve` would raise, one line each (empty: the config runs)."""
    return _unique(_resolve(cfg, data, model, custom_loss)[0])


def _resolve(cfg, data, model, custom_loss):
    found = []
    try:
        algo = lookup(cfg.algorithm.name).form(cfg.algorithm)
    except ConfigError as e:
        return list(e.messages), None       # nothing else can be judged without the algorithm's declarations
    found += takes_problems(model, cfg.model.name, cfg.data.name, data.num_classes)
    num_clients = algo.client_count(cfg.algorithm, cfg.partition.clients)
    personal = _asked(found, personal_entries, cfg, model, algo) or ()
    for check in (lambda: algo.check(cfg, model),
                  lambda: check_robust(algo, server=cfg.server, attack=cfg.attack, algorithm_name=cfg.algorithm.name,
                                       privacy=cfg.privacy, client_drift=cfg.eval.client_drift,
                                       server_data=cfg.server_data),
                  lambda: check_optimizer(cfg.server),
                  lambda: deploy_check(cfg, algo, num_clients),
                  lambda: _vectorize(cfg, algo, model, personal, custom_loss)):
        _asked(found, check)
    attack_problems = attack_checks.problems(cfg, algo, data)
    found += attack_problems
    found += wire_problems(cfg.runtime.wire_dtype, algo.protocol, algorithm_name=cfg.algorithm.name,
                           compress=cfg.client.compress.name, secure_aggregation=cfg.server.secure_aggregation)
    found += secagg_problems(cfg, algo)
    found += _eval_problems(cfg.eval, data)
    if cfg.server.sampling == "poisson":
        _asked(found, PoissonSampling.check, cfg, algo)
    if cfg.privacy.enabled:
        found += privacy_problems(cfg, algo)
        _asked(found, accounting.library)       # not installed: the pip command
    sections = section_names(type(cfg))
    stage_problems = stage_catalog.problems(cfg.uploads, sections, protocol=algo.protocol, privacy=cfg.privacy,
                                            secure_aggregation=cfg.server.secure_aggregation)
    deployment = (cfg.clients != ClientsConfig() or cfg.server.deadline is not None or bool(cfg.server.over_select))
    provider_problems = provider_catalog.problems(cfg.participation, sections, protocol=algo.protocol,
                                                  privacy=cfg.privacy, sampling=cfg.server.sampling,
                                                  deployment=deployment)
    found += stage_problems + provider_problems
    found += counterfactual_problems(cfg, algo)
    found += update_record.problems(cfg.checkpoint, protocol=algo.protocol, algorithm_name=cfg.algorithm.name,
                                    secure_aggregation=cfg.server.secure_aggregation)
    left_out = set(cfg.counterfactual.drop) | set(cfg.counterfactual.remove)
    found += federaser.problems(cfg.unlearning, rounds=cfg.rounds, clients=cfg.partition.clients,
                                clients_per_round=cfg.server.clients_per_round, protocol=algo.protocol,
                                counted=set(range(cfg.partition.clients)) - left_out,
                                algorithm_name=cfg.algorithm.name)
    malicious = () if attack_problems else tuple(int(i) for i in malicious_clients(cfg.attack, num_clients,
                                                                                    cfg.seed))
    plan = RunPlan(cfg=cfg, data=data, model=model, algorithm=algo, personal=tuple(personal),
                   num_clients=num_clients, malicious=malicious,
                   attack_note=no_malicious_note(cfg.attack, malicious, num_clients),
                   robust=robust_active(cfg.server.aggregator, cfg.attack.name), custom_loss=custom_loss,
                   plugin_stages=() if stage_problems else stage_catalog.plugin_stages(cfg.uploads, sections),
                   plugin_provider=(None if provider_problems or cfg.participation.name is None
                                    else provider_catalog.provider_class(cfg.participation.name, sections)))
    return found, plan


def _vectorize(cfg, algo, model, personal, custom_loss):
    """client.vectorize = on refused where clients cannot train as batched groups (auto falls back)."""
    if cfg.client.vectorize != "on":
        return
    blocker = model.unbatchable
    if not algo.vectorizable:
        blocker = f"algorithm.name = {cfg.algorithm.name!r} does not declare its clients vectorizable"
    elif personal:
        blocker = "clients with personal parameters (model.personal) start from their own entries"
    elif custom_loss:
        blocker = "a custom loss trains client by client"
    if blocker:
        raise ConfigError(f"client.vectorize = 'on': {blocker}; use auto (batch clients where possible) or off")


def _asked(found, fn, *args):
    """fn(*args), its ConfigError's lines added to `found` (then None)."""
    try:
        return fn(*args)
    except ConfigError as e:
        found.extend(e.messages)
        return None


def _unique(lines):
    return list(dict.fromkeys(lines))       # a problem two rules share is reported once


__all__ = ["RunPlan", "problems", "resolve"]


def _eval_problems(eval_cfg, data):
    """eval.max_samples subsamples the global test set: it must be below the set's size to mean anything."""
    if eval_cfg.max_samples is not None and eval_cfg.max_samples >= data.n_test:
        return [f"eval.max_samples = {eval_cfg.max_samples}: the global test set holds {data.n_test} samples, so "
                f"this subsample would be all of them; set a smaller number, or null to evaluate the whole set"]
    return []
