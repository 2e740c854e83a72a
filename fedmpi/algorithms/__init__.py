"""The algorithms: the contract (`base`), the registry (`registry`) and fedmpi's own algorithms, which
register themselves on import. `algorithm.name` -> class through `registry.lookup`."""

from fedmpi.algorithms import (  # noqa: F401 - imported for their @register
    central,
    datashare,
    fedavg,
    fedbuff,
    feddyn,
    fednova,
    fedprox,
    fedskip,
    fsl,
    moon,
    safl,
    scaffold,
)
from fedmpi.algorithms.base import Algorithm, AlgorithmKeys, ClientRun, SetupContext
from fedmpi.algorithms.registry import lookup, register


def build_algorithm(cfg, dim, n_params) -> Algorithm:
    """The algorithm instance for `cfg.algorithm` (ConfigError for an unknown name)."""
    return lookup(cfg.algorithm.name).create(cfg, dim, n_params)


__all__ = ["Algorithm", "AlgorithmKeys", "ClientRun", "SetupContext", "build_algorithm", "lookup", "register"]
