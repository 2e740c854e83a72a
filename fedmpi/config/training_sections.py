"""The config's training sections, `client:` and `server:`, as frozen dataclasses like those of
fedmpi.config.sections: how each client trains locally, and how the server selects clients, combines their
updates and applies them. Every field has a type, a default and a docstring; each section range-checks its
own values in `__post_init__`."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar, Literal

from fedmpi.config.sections import _check_plugin_name
from fedmpi.core.config_checks import Checks as _Checks
from fedmpi.core.config_checks import Range, clients_range, count, factor
from fedmpi.core.errors import ConfigError
from fedmpi.core.schedules import ScheduleConfig
from fedmpi.deploy.keys import CompressConfig, DeadlineConfig
from fedmpi.robust.keys import RobustConfig, aggregator_problems


def _server_optimizers():
    """The built-in server optimizers' names, imported when a config is checked (not when read back)."""
    from fedmpi.round.server_opt import OPTIMIZERS

    return tuple(OPTIMIZERS)


@dataclass(frozen=True)
class ClientConfig:
    """Local training on each client (`client:`): local SGD, its schedule, and the upload's compression."""

    lr: float = 0.05
    """The local SGD learning rate eta_l."""
    batch_size: int = 10
    """The local batch size B."""
    epochs: int = 1
    """Local epochs E, used when `steps` is null."""
    steps: int | None = None
    """Local SGD steps K; overrides `epochs`."""
    momentum: float = 0.0
    """Local SGD momentum (torch.optim.SGD's); it restarts for each client each round."""
    weight_decay: float = 0.0
    """Local L2 weight decay (torch.optim.SGD's)."""
    vectorize: Literal["auto", "on", "off"] = "auto"
    """Train a round's clients as batched computations where the algorithm and model allow: auto decides once
    for the job from the config, on batches wherever allowed, off never; the two paths agree to rounding."""
    lr_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """eta_l per round."""
    compress: CompressConfig = field(default_factory=CompressConfig)
    """Upload compression (docs/how-to/deployment.md)."""
    drop_last: bool = False
    """Drop each epoch's short last batch, as a DataLoader with drop_last=True (FedSkip's CIFAR loaders); a
    client with fewer than batch_size samples keeps its one short batch (fedmpi.core.train.steps_per_epoch)."""

    RANGES: ClassVar[dict] = {"lr": factor(low_open=True), "weight_decay": factor(), "epochs": count(),
                              "steps": count(), "batch_size": count(), "momentum": Range(0, 1, high_open=True)}

    def __post_init__(self):
        c = _Checks("client")
        c.require(self.lr > 0, "lr", self.lr, "must be > 0")
        c.require(self.batch_size >= 1, "batch_size", self.batch_size, "must be a positive integer")
        c.require(self.epochs >= 1, "epochs", self.epochs, "must be a positive integer")
        c.require(self.steps is None or self.steps >= 1, "steps", self.steps, "must be a positive integer or null")
        c.require(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
        c.require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        _check_min_lr(c, self.lr, self.lr_schedule)
        c.done()


def _check_min_lr(c, lr, schedule):
    """A cosine schedule decays from lr to min_lr; a min_lr above lr was silently clamped to lr."""
    c.require(schedule.name != "cosine" or schedule.min_lr <= lr, "lr_schedule.min_lr", schedule.min_lr,
              f"must be <= {c.section}.lr ({lr:g}): the cosine schedule decays from lr down to min_lr")


def _part(server, part):
    """The value of `part` of UNUSED_CHECKED ("betas[1]": the second beta) in a ServerConfig or a dict."""
    get = server.get if isinstance(server, dict) else lambda key: getattr(server, key)
    if part.startswith("betas["):
        return get("betas")[int(part[6])]
    return get(part)


@dataclass(frozen=True)
class ServerConfig:
    """The server (`server:`): which clients each round, how their updates are combined and applied."""

    clients_per_round: int = 10
    """S, the clients drawn each round (without replacement)."""
    lr: float = 1.0
    """eta_g, the server's step on the aggregated update; 1.0 with sgd = plain averaging."""
    optimizer: str = "sgd"
    """How the aggregated update is applied (fedmpi.round.server_opt): sgd, avgm, adam, yogi, adagrad, an
    installed entry point of `fedmpi.server_optimizers`, or `package.module:Class`."""
    momentum: float = 0.9
    """avgm: the server momentum beta."""
    betas: tuple[float, float] = (0.9, 0.99)
    """adam, yogi, adagrad: (b1, b2)."""
    tau: float = 1e-3
    """adam, yogi, adagrad: the adaptivity (Reddi et al.), in (0, 1e3]: the step is lr * m / (sqrt(v) + tau),
    so a tau far above any sqrt(v) only scales the step down (Reddi et al. tune it in [1e-10, 1])."""
    lr_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """eta_g per round."""
    trains_clients: bool | None = None
    """Rank 0 hosts clients too; null: when its node has a core the other ranks leave idle. Results do not
    depend on it (a run-time key: not hashed, may change on --resume)."""
    deadline: float | None = None
    """Simulated seconds after which updates do not count (docs/how-to/deployment.md); null: none."""
    over_select: float | None = None
    """Extra clients selected, as a fraction, keeping the first clients_per_round to arrive; null: none."""
    sampling: Literal["fixed", "poisson"] = "fixed"
    """fixed: exactly clients_per_round clients per round; poisson: each client joins independently with rate
    clients_per_round / partition.clients (the sampling DP accounting assumes; docs/how-to/privacy.md)."""
    aggregator: str = "mean"
    """How the round's updates are combined (fedmpi.robust, docs/how-to/robustness.md): mean is the weighted
    mean of the plain reduction; the robust rules (median, trimmed_mean, krum, multi_krum, bulyan, geomed,
    centered_clip, norm_bound, fltrust, or a plug-in) see every counted update through a chunked gather."""
    robust: RobustConfig = field(default_factory=RobustConfig)
    """The robust aggregators' keys."""
    secure_aggregation: Literal["none", "secagg", "secagg_plus"] = "none"
    """none: the server sums the clients' float updates; secagg / secagg_plus: it sees only the modular sum of
    masked integer uploads (the `secagg:` section, fedmpi.secagg; docs/how-to/secure-aggregation.md)."""
    weighting: Literal["samples", "uniform"] = "samples"
    """A client's weight in the average: samples, its sample count n_i (McMahan et al.); uniform, 1 for every
    client (pfl-research's `weight_by_samples: false`). Privacy and secure aggregation weigh uniformly anyway."""

    RANGES: ClassVar[dict] = {"lr": factor(low_open=True), "over_select": factor(),
                              "deadline": Range(0, 1e12, "simulated seconds: 30,000 years"),
                              "clients_per_round": clients_range(), "momentum": Range(0, 1, high_open=True),
                              "tau": Range(0, 1e3, "beyond, tau only scales the step down", low_open=True)}

    def __post_init__(self):
        c = _Checks("server")
        c.require(self.weighting in ("samples", "uniform"), "weighting", self.weighting,
                  "must be samples (by sample count) or uniform (every client 1)")
        c.require(not (self.weighting == "uniform" and self.aggregator != "mean"), "weighting", self.weighting,
                  f"uniform applies to the plain mean (server.aggregator: mean); {self.aggregator!r} weighs "
                  f"clients by its own rule")
        c.errors.extend(aggregator_problems(self.aggregator, self.robust, self.clients_per_round))
        c.require(self.secure_aggregation in ("none", "secagg", "secagg_plus"), "secure_aggregation",
                  self.secure_aggregation, "must be none, secagg or secagg_plus")
        c.require(self.clients_per_round >= 1, "clients_per_round", self.clients_per_round,
                  "must be a positive integer")
        c.require(self.lr > 0, "lr", self.lr, "must be > 0")
        _check_plugin_name(c, "optimizer", self.optimizer, _server_optimizers(), "fedmpi.server_optimizers", "Class")
        c.require(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
        c.require(all(0 <= b < 1 for b in self.betas), "betas", list(self.betas), "must be two numbers in [0, 1)")
        c.require(self.tau > 0, "tau", self.tau, "must be > 0")
        _check_min_lr(c, self.lr, self.lr_schedule)
        try:
            self.straggler_policy()
        except ConfigError as e:
            c.errors.extend(e.messages)
        if not c.errors:
            self._check_unused(c)
        c.done()

    def _check_unused(self, c, uses=None):
        """A momentum, beta or tau the optimizer does not read, set to a non-default value, is refused; `uses`:
        a plug-in's declaration, known once it is imported (fedmpi.round.server_opt.check_optimizer)."""
        from fedmpi.round.server_opt import OPTIMIZERS, UNUSED_CHECKED

        uses = getattr(OPTIMIZERS.get(self.optimizer), "uses", None) if uses is None else uses
        if uses is None:
            return
        for part in UNUSED_CHECKED:
            if part not in uses and _part(self, part) != _part(_SERVER_DEFAULTS, part):
                users = [name for name, cls in OPTIMIZERS.items() if part in (getattr(cls, "uses", None) or ())]
                key = part.split("[")[0]
                what = "" if key == part else f"its {'b1' if part.endswith('0]') else 'b2'} ({part}) "
                c.require(False, key, list(self.betas) if key == "betas" else getattr(self, key),
                          f"{what}is not used by server.optimizer {self.optimizer!r} (only by {', '.join(users)}); "
                          f"remove it or choose an optimizer that uses it")

    def straggler_policy(self) -> DeadlineConfig:
        """`deadline` and `over_select` as the deployment model's DeadlineConfig (checked there)."""
        return DeadlineConfig(self.deadline, self.over_select)


_SERVER_DEFAULTS = {f.name: f.default for f in fields(ServerConfig) if f.default is not MISSING}
