"""Every experiment's config, checked before the first experiment starts.

`build` makes each experiment's Config from the spec (its config file and overrides, exactly as `fedmpi run
FILE key=value ...` would) and reports every problem of every experiment at once; `check` resolves each config
against the shapes of its data set and model (fedmpi.run.resolve, the validation set-up makes) on the
dispatcher, with the sweep's data sets loaded, and returns each experiment's estimated size, by which the
largest go first. A problem that several experiments share is one line naming them.
"""

from __future__ import annotations

import dataclasses
import json

from fedmpi.core.errors import ConfigError, FedmpiError
from fedmpi.run.api import as_config
from fedmpi.sweep.spec import with_out

NAMES_SHOWN = 3


def build(spec) -> list:
    """[Config] of the spec's experiments, in order; ConfigError with every problem (see `joined`)."""
    configs, problems = [], {}
    for exp in spec.experiments:
        exp = with_out(exp, spec.out)
        try:
            configs.append(as_config(exp.config, exp.overrides))
        except ConfigError as e:
            configs.append(None)
            for line in e.messages:
                problems.setdefault(line, []).append(exp.name)
    if problems:
        raise ConfigError(joined(problems))
    return configs


def joined(problems) -> list:
    """{line: [experiment names]} as lines: `experiment NAME: line`, or `N experiments (A, B, C, ...): line`."""
    lines = []
    for line, names in problems.items():
        if len(names) == 1:
            lines.append(f"experiment {names[0]}: {line}")
        else:
            shown = ", ".join(names[:NAMES_SHOWN]) + (", ..." if len(names) > NAMES_SHOWN else "")
            lines.append(f"{len(names)} experiments ({shown}): {line}")
    return lines


def ranks(spec, cfg, available) -> int:
    """The ranks `cfg`'s experiment runs on: the spec's number, or its rule (at most `available`)."""
    if isinstance(spec.ranks, int):
        return spec.ranks
    return min(spec.ranks.of(cfg.server.clients_per_round), available)


def too_many_ranks(spec, configs, available) -> list:
    """Lines for the experiments that need more ranks than the launch gives them."""
    problems = {}
    for exp, cfg in zip(spec.experiments, configs):
        k = ranks(spec, cfg, available)
        if k > available:
            problems.setdefault(f"ranks = {k}: more than the {available} rank(s) this launch has for experiments "
                                f"(mpiexec -n P gives P - 1: rank 0 dispatches)", []).append(exp.name)
    return joined(problems)


def data_key(cfg) -> str:
    """What decides the arrays `cfg` loads: its data section (fedmpi.data.sources reads nothing else), and for
    `synthetic` the seed and the clients it generates; experiments with one key share one copy."""
    key = {"data": dataclasses.asdict(cfg.data)}
    if cfg.data.name == "synthetic":
        key.update(seed=cfg.seed, clients=cfg.partition.clients, per_client=cfg.partition.samples_per_client)
    return json.dumps(key, sort_keys=True, default=str)


def check(spec, configs, datasets) -> list:
    """Rank 0 of the sweep: every config resolved against its data set's and model's shapes (as set-up does);
    ConfigError with every problem at once, else each experiment's estimated size (`size`)."""
    from fedmpi.data.data_shape import DataShape
    from fedmpi.run.resolve import resolve

    shapes, problems, sizes = {}, {}, []
    for exp, cfg in zip(spec.experiments, configs):
        dataset = datasets[data_key(cfg)]
        try:
            model = _model_shape(cfg, dataset, shapes)
            resolve(cfg, DataShape.of(dataset), model)
        except FedmpiError as e:
            for line in (e.messages if isinstance(e, ConfigError) else [str(e)]):
                problems.setdefault(line, []).append(exp.name)
            sizes.append(0)
            continue
        sizes.append(size(cfg, len(dataset.y_train), model.n_params))
    if problems:
        raise ConfigError(joined(problems))
    return sizes


def _model_shape(cfg, dataset, cache):
    """The ModelShape of `cfg`'s model on `dataset`, as set-up measures it (built once per model and data)."""
    from fedmpi.core import rng
    from fedmpi.core.flat import FlatModel, forward_probe
    from fedmpi.core.models import build_model

    key = (json.dumps([dataclasses.asdict(cfg.model), dataclasses.asdict(cfg.lora)], sort_keys=True, default=str),
           tuple(dataset.input_shape), dataset.num_classes)
    if key not in cache:
        rng.seed_torch(cfg.seed, rng.INIT)
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes, cfg.lora)
        cache[key] = FlatModel(model).describe(forward_probe(model, dataset.x_train))
    return cache[key]


def size(cfg, n_train, n_params) -> float:
    """An experiment's work, for the order (largest first) and the time-left estimate: samples trained over the
    run times the model's parameters (a round trains clients_per_round clients, each `client.steps` batches or
    `client.epochs` passes over its n_train / clients samples)."""
    c = cfg.client
    per_client = c.steps * c.batch_size if c.steps else c.epochs * n_train / max(1, cfg.partition.clients)
    return float(cfg.rounds) * cfg.server.clients_per_round * per_client * max(1, n_params)
