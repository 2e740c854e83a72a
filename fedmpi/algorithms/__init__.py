"""The algorithms: the contract (`base`), the registry (`registry`) and fedmpi's own algorithms, which
register themselves on import. `algorithm.name` -> class through `registry.lookup`; the class is built from
its keys and an `AlgorithmContext` (`algorithm_context`, the one place that reads the config for it)."""

from fedmpi.algorithms.base import (
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


def algorithm_context(cfg, dim, n_params, history=None) -> AlgorithmContext:
    """The context an algorithm of this config is built with. `history` answers `selected(t)`: a run passes
    its participation provider's plans (`PlanHistory(participation.plan)`); without one (hook tests,
    `--dry-run`) it is the standard draw, which the default provider plans."""
    c = cfg.client
    client = ClientTraining(lr=c.lr, batch_size=c.batch_size, epochs=c.epochs, steps=c.steps, momentum=c.momentum,
                            drop_last=c.drop_last, lr_schedule=c.lr_schedule)
    if history is None:
        history = StandardDraws(cfg.seed, cfg.partition.clients, cfg.server.clients_per_round)
    return AlgorithmContext(seed=cfg.seed, num_clients=cfg.partition.clients,
                            clients_per_round=cfg.server.clients_per_round, rounds=cfg.rounds, dim=dim,
                            n_params=n_params, history=history, client=client,
                            privacy_enabled=cfg.privacy.enabled)


def build_algorithm(cfg, dim, n_params, history=None) -> Algorithm:
    """The algorithm instance for `cfg.algorithm` (ConfigError for an unknown name)."""
    return lookup(cfg.algorithm.name).create(cfg.algorithm, algorithm_context(cfg, dim, n_params, history))


__all__ = ["Algorithm", "AlgorithmContext", "AlgorithmKeys", "ClientRun", "ClientTraining", "PlanHistory",
           "SetupContext", "StandardDraws", "algorithm_context", "build_algorithm", "lookup", "register"]
