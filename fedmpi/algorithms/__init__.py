"""Algorithm registry: `algorithm.name` -> hooks class."""

from fedmpi.algorithms.base import Algorithm, ClientRun
from fedmpi.algorithms.central import Central
from fedmpi.algorithms.datashare import DataShare
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.feddyn import FedDyn
from fedmpi.algorithms.fednova import FedNova
from fedmpi.algorithms.fedprox import FedProx
from fedmpi.algorithms.fedskip import FedSkip
from fedmpi.algorithms.fsl import Fsl
from fedmpi.algorithms.moon import Moon
from fedmpi.algorithms.safl import Safl
from fedmpi.algorithms.scaffold import Scaffold
from fedmpi.errors import ConfigError

REGISTRY = {cls.name: cls for cls in (FedAvg, Central, Fsl, FedSkip, DataShare, Safl,
                                      FedProx, Scaffold, FedDyn, FedNova, Moon)}


def build_algorithm(cfg, dim, n_params) -> Algorithm:
    cls = REGISTRY.get(cfg.algorithm.name)
    if cls is None:
        raise ConfigError(f"algorithm.name = {cfg.algorithm.name!r}: not available in this version; "
                          f"available: {', '.join(REGISTRY)}")
    return cls(cfg, dim, n_params)


__all__ = ["Algorithm", "ClientRun", "REGISTRY", "build_algorithm"]
