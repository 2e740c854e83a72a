"""The algorithms' own config keys (ALGORITHMS.md "Algorithm keys", contract): one frozen dataclass per
`algorithm.name`, validated like every other config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedmpi.config_checks import Checks as _Checks


@dataclass(frozen=True)
class FedAvgKeys:
    name: str = "fedavg"


@dataclass(frozen=True)
class CentralKeys:
    name: str = "central"


@dataclass(frozen=True)
class FslKeys:
    name: str = "fsl"
    gamma: float = 1.0
    mode: Literal["incremental", "parallel"] = "incremental"
    server_epochs: int | None = None
    server_lr: float | None = None
    server_batch_size: int | None = None
    pretrain_epochs: int = 0
    pretrain_lr: float = 0.01

    def __post_init__(self):
        c = _Checks("algorithm")
        c.require(self.gamma >= 0, "gamma", self.gamma, "must be >= 0")
        c.require(self.server_epochs is None or self.server_epochs >= 1, "server_epochs", self.server_epochs,
                  "must be a positive integer or null")
        c.require(self.server_lr is None or self.server_lr > 0, "server_lr", self.server_lr, "must be > 0 or null")
        c.require(self.server_batch_size is None or self.server_batch_size >= 1, "server_batch_size",
                  self.server_batch_size, "must be a positive integer or null")
        c.require(self.pretrain_epochs >= 0, "pretrain_epochs", self.pretrain_epochs, "must be >= 0")
        c.require(self.pretrain_lr > 0, "pretrain_lr", self.pretrain_lr, "must be > 0")
        c.done()


@dataclass(frozen=True)
class FedSkipKeys:
    name: str = "fedskip"
    delta: int = 3

    def __post_init__(self):
        c = _Checks("algorithm")
        c.require(self.delta >= 1, "delta", self.delta, "must be a positive integer")
        c.done()


@dataclass(frozen=True)
class DataShareKeys:
    name: str = "datashare"
    alpha: float = 0.5
    warmup_epochs: int = 0
    warmup_lr: float = 0.01

    def __post_init__(self):
        c = _Checks("algorithm")
        c.require(0 <= self.alpha <= 1, "alpha", self.alpha, "must be in [0, 1]")
        c.require(self.warmup_epochs >= 0, "warmup_epochs", self.warmup_epochs, "must be >= 0")
        c.require(self.warmup_lr > 0, "warmup_lr", self.warmup_lr, "must be > 0")
        c.done()


@dataclass(frozen=True)
class SaflKeys:
    name: str = "safl"
    L: float = 10.0
    q: int = 1
    eps: float = 0.5
    gating: bool = False
    nu: float = 1.0
    probe: Literal["server", "local"] = "server"
    probe_size: int = 200
    fusion: Literal["samples", "ida"] = "samples"

    def __post_init__(self):
        c = _Checks("algorithm")
        c.require(self.L > 0, "L", self.L, "must be > 0")
        c.require(self.q >= 1, "q", self.q, "must be a positive integer")
        c.require(0 <= self.eps <= 1, "eps", self.eps, "must be in [0, 1]")
        c.require(self.nu >= 0, "nu", self.nu, "must be >= 0")
        c.require(self.probe_size >= 1, "probe_size", self.probe_size, "must be a positive integer")
        c.done()


@dataclass(frozen=True)
class FedProxKeys:
    name: str = "fedprox"
    mu: float = 0.01

    def __post_init__(self):
        c = _Checks("algorithm")
        c.require(self.mu >= 0, "mu", self.mu, "must be >= 0")
        c.done()


@dataclass(frozen=True)
class ScaffoldKeys:
    name: str = "scaffold"


@dataclass(frozen=True)
class FedDynKeys:
    name: str = "feddyn"
    alpha: float = 0.01

    def __post_init__(self):
        c = _Checks("algorithm")
        c.require(self.alpha > 0, "alpha", self.alpha, "must be > 0")
        c.done()


@dataclass(frozen=True)
class FedNovaKeys:
    name: str = "fednova"


@dataclass(frozen=True)
class MoonKeys:
    name: str = "moon"
    mu: float = 1.0
    tau: float = 0.5

    def __post_init__(self):
        c = _Checks("algorithm")
        c.require(self.mu >= 0, "mu", self.mu, "must be >= 0")
        c.require(self.tau > 0, "tau", self.tau, "must be > 0")
        c.done()


ALGORITHM_KEYS = {k().name: k for k in (FedAvgKeys, CentralKeys, FslKeys, FedSkipKeys, DataShareKeys,
                                          SaflKeys, FedProxKeys, ScaffoldKeys, FedDynKeys, FedNovaKeys, MoonKeys)}
