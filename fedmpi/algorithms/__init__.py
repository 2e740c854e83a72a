"""The algorithms: the contract (`base`), the registry (`registry`) and fedmpi's own algorithms, which
register themselves on import. `algorithm.name` -> class through `registry.lookup`; the class is built from
its keys and an `AlgorithmContext` (`algorithm_context`, the one place that reads the config for it)."""

from fedmpi.algorithms.base import (
    REDUCE,
    Algorithm,
    AlgorithmContext,
    AlgorithmKeys,
    ClientRun,
    ClientTraining,
    PlanHistory,
    SetupContext,
    StandardDraws,
)
from fedmpi.algorithms.registry import lookup, register
from fedmpi.core.errors import ConfigError
from fedmpi.core.personal import ParameterSplit, split_model


def algorithm_context(cfg, dim, n_params, history=None, split=None) -> AlgorithmContext:
    """The context an algorithm of this config is built with. `history` answers `selected(t)`: a run passes
    its participation provider's plans (`PlanHistory(participation.plan)`); without one (hook tests,
    `--dry-run`) it is the standard draw, which the default provider plans. `split`: the model's
    `personal_split` (None or empty: nothing personal)."""
    c = cfg.client
    client = ClientTraining(lr=c.lr, batch_size=c.batch_size, epochs=c.epochs, steps=c.steps, momentum=c.momentum,
                            drop_last=c.drop_last, lr_schedule=c.lr_schedule)
    if history is None:
        history = StandardDraws(cfg.seed, cfg.partition.clients, cfg.server.clients_per_round)
    return AlgorithmContext(seed=cfg.seed, num_clients=cfg.partition.clients,
                            clients_per_round=cfg.server.clients_per_round, rounds=cfg.rounds, dim=dim,
                            n_params=n_params, history=history, client=client,
                            privacy_enabled=cfg.privacy.enabled, split=split if split else None)


def personal_split(cfg, model, algo_cls=None) -> ParameterSplit | None:
    """The flat model's personal entries: the union of `model.personal` and the algorithm class's
    `personal_patterns(keys, model)` (`model`: a FlatModel). None when nothing is personal. ConfigError naming
    the key: a pattern that matches no parameter or buffer, patterns that leave nothing shared, personal
    entries under a protocol other than REDUCE (its uploads are not per-client vectors from the broadcast)."""
    algo_cls = lookup(cfg.algorithm.name) if algo_cls is None else algo_cls
    named = f"algorithm.name = {cfg.algorithm.name!r}"
    sources = (("model.personal", tuple(cfg.model.personal)), (named, tuple(algo_cls.personal_patterns(cfg.algorithm,
                                                                                                       model))))
    split = split_model(model.entries, model.dim, sources)
    if not split:
        return None
    if algo_cls.protocol != REDUCE:
        raise ConfigError(f"model.personal: personal parameters need an algorithm of the REDUCE family; {named} "
                          f"uploads by {algo_cls.protocol}; leave model.personal empty")
    return split


def build_algorithm(cfg, dim, n_params, history=None, split=None) -> Algorithm:
    """The algorithm instance for `cfg.algorithm` (ConfigError for an unknown name)."""
    return lookup(cfg.algorithm.name).create(cfg.algorithm, algorithm_context(cfg, dim, n_params, history, split))


__all__ = ["Algorithm", "AlgorithmContext", "AlgorithmKeys", "ClientRun", "ClientTraining", "PlanHistory",
           "SetupContext", "StandardDraws", "algorithm_context", "build_algorithm", "lookup", "personal_split",
           "register"]
