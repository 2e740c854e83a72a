"""Algorithm registry: `algorithm.name` -> hooks class."""

from fedmpi.algorithms.base import Algorithm, ClientRun
from fedmpi.algorithms.central import Central
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.errors import ConfigError

REGISTRY = {cls.name: cls for cls in (FedAvg, Central)}


def build_algorithm(cfg, dim, n_params) -> Algorithm:
    cls = REGISTRY.get(cfg.algorithm.name)
    if cls is None:
        raise ConfigError(f"algorithm.name = {cfg.algorithm.name!r}: not available in this version; "
                          f"available: {', '.join(REGISTRY)}")
    return cls(cfg, dim, n_params)


__all__ = ["Algorithm", "ClientRun", "REGISTRY", "build_algorithm"]
