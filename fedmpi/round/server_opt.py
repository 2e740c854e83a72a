"""Server optimizers: how rank 0 applies the round's aggregated update (`server.optimizer`).

An algorithm's `aggregate` returns the update u_t (for FedAvg sum_i p_i Delta_i, the negative of Reddi et
al.'s pseudo-gradient); the optimizer turns it into the next global model, so every reduce-based algorithm
composes with every optimizer and a new optimizer needs no algorithm code.

    sgd       x + eta * u                                           (FedAvg with server lr eta_g)
    avgm      m = beta m + u;                        x + eta * m    (FedAvgM, Hsu et al. 2019)
    adam      m = b1 m + (1 - b1) u; v = b2 v + (1 - b2) u^2;   x + eta * m / (sqrt(v) + tau)
    yogi      v = v - (1 - b2) u^2 sign(v - u^2), otherwise as adam
    adagrad   v = v + u^2, otherwise as adam (m with b1)
(Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2: m starts at 0, v at tau^2, no bias
correction.) `beta` is `server.momentum`, (b1, b2) `server.betas`, tau `server.tau`, eta `server.lr` under
`server.lr_schedule`. Moments are float64 on rank 0 and saved in checkpoints under /optimizer.

The stateful rules act on the trainable part of the vector; float buffers (batch-norm statistics) are
statistics, not parameters, and take the plain average (x + u). `sgd` scales the whole vector, as fedmpi
always has.
"""

from __future__ import annotations

import abc

from fedmpi.algorithms.state import ServerVectors
from fedmpi.core import plugin_names
from fedmpi.core.config_checks import Checks
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import UPDATE_BLOCK, in_blocks
from fedmpi.core.lazy import torch

OPTIMIZERS: dict = {}
# The optimizer keys of ServerConfig whose use depends on the rule (betas split into b1 and b2: adagrad
# reads only b1).
UNUSED_CHECKED = ("momentum", "betas[0]", "betas[1]", "tau")


def register_optimizer(cls):
    OPTIMIZERS[cls.name] = cls
    return cls


class ServerOptimizer(abc.ABC):
    name = ""
    # The ServerConfig keys this rule reads, of UNUSED_CHECKED ("betas[1]" is b2 alone); None: not declared
    # (a plug-in optimizer), nothing is refused. ServerConfig refuses a non-default value of the others.
    uses: tuple | None = None

    def __init__(self, server_cfg, dim, n_params):
        self.cfg, self.dim, self.n_params = server_cfg, dim, n_params
        self.moments = ServerVectors(dtype=torch.float64)
        self._mean = None       # step_on_mean's float64 mean, reused every round

    @abc.abstractmethod
    def step(self, x: torch.Tensor, update: torch.Tensor, lr: float) -> torch.Tensor:
        """The next global model (float32) from x and the float64 update; x may be updated in place (the
        server holds x in memory of its own)."""

    def step_on_mean(self, x: torch.Tensor, sums: torch.Tensor, weight: float, lr: float) -> torch.Tensor:
        """`step` with FedAvg's update, the weighted mean sums / weight (weight > 0); a rule may fuse the two."""
        self._mean = torch.div(sums, weight, out=self._mean if _fits(self._mean, sums) else None)
        return self.step(x, self._mean, lr)

    def state(self) -> dict:
        return self.moments.state()

    def expected_state(self) -> dict:
        """{name: (shape, dtype)} of the state a checkpoint must hold for this optimizer (its moments: n_params
        float64 entries each; nothing for sgd), checked before `load_state`."""
        return self.moments.spec()

    def load_state(self, state: dict):
        self.moments.load(state)

    def _apply(self, x, update, step_params):
        """x + step on the trainable part, x + update (the plain average) on the buffers."""
        n = self.n_params
        new = x.double()
        new[:n] += step_params
        new[n:] += update[n:]
        return new.to(x.dtype)


@register_optimizer
class Sgd(ServerOptimizer):
    name = "sgd"
    uses = ()

    def __init__(self, server_cfg, dim, n_params):
        super().__init__(server_cfg, dim, n_params)
        self._step = None       # float32 scratch: the step, rounded as `x + (update * lr).to(x.dtype)` would

    def step_on_mean(self, x, sums, weight, lr):
        # On the CPU the mean and the step in one blocked pass (mean_sgd_step): no model-sized mean.
        if x.device.type != "cpu":
            return super().step_on_mean(x, sums, weight, lr)
        return mean_sgd_step(x, sums, weight, lr)

    def step(self, x, update, lr):
        # x + float32(update * lr), in place: no model-sized temporaries on rank 0 between the reduction and
        # the next broadcast, where every worker waits (fresh large allocations cost page faults each time).
        if self._step is None or self._step.shape != x.shape or self._step.device != x.device:
            self._step = torch.empty_like(x)
        self._step.copy_(update if lr == 1.0 else update * lr)
        return x.add_(self._step)


def _fits(out, like):
    return out is not None and out.shape == like.shape and out.device == like.device and out.dtype == like.dtype


def mean_sgd_step(x, sums, weight, lr, block=UPDATE_BLOCK):
    """FedAvg's server step in one pass: x += float32((sums / weight) * lr) in place, block by block, the very
    operations of `weighted_mean_update` then `Sgd.step` on every entry (so the same bits), without their
    model-sized mean and step vectors. `x` float32 and `sums` float64, on the CPU, of equal length."""
    for i, j, (mean, step) in in_blocks(x.numel(), block, torch.float64, torch.float32):
        m = torch.div(sums[i:j], weight, out=mean)
        if lr != 1.0:
            m.mul_(lr)
        x[i:j].add_(step.copy_(m))
    return x


@register_optimizer
class AvgM(ServerOptimizer):
    name = "avgm"
    uses = ("momentum",)

    def __init__(self, server_cfg, dim, n_params):
        super().__init__(server_cfg, dim, n_params)
        self.moments = ServerVectors(dtype=torch.float64, m=n_params)

    def step(self, x, update, lr):
        m = self.moments.get("m", x.device)
        m.mul_(self.cfg.momentum).add_(update[: self.n_params])
        return self._apply(x, update, lr * m)


class _Adaptive(ServerOptimizer):
    """Reddi et al.'s Algorithm 2; subclasses differ in the second-moment rule."""

    uses = ("betas[0]", "betas[1]", "tau")

    def __init__(self, server_cfg, dim, n_params):
        super().__init__(server_cfg, dim, n_params)
        self.moments = ServerVectors(dtype=torch.float64, fill={"v": server_cfg.tau ** 2}, m=n_params, v=n_params)

    @abc.abstractmethod
    def second_moment_(self, v, sq):
        """Updates v in place from the squared update `sq`."""

    def step(self, x, update, lr):
        b1, _ = self.cfg.betas
        u = update[: self.n_params]
        m, v = self.moments.get("m", x.device), self.moments.get("v", x.device)
        m.mul_(b1).add_(u, alpha=1 - b1)
        self.second_moment_(v, u * u)
        return self._apply(x, update, lr * m / (v.sqrt() + self.cfg.tau))


@register_optimizer
class Adam(_Adaptive):
    name = "adam"

    def second_moment_(self, v, sq):
        b2 = self.cfg.betas[1]
        v.mul_(b2).add_(sq, alpha=1 - b2)


@register_optimizer
class Yogi(_Adaptive):
    name = "yogi"

    def second_moment_(self, v, sq):
        v.sub_((1 - self.cfg.betas[1]) * sq * torch.sign(v - sq))


@register_optimizer
class Adagrad(_Adaptive):
    name = "adagrad"
    uses = ("betas[0]", "tau")        # v = v + u^2: no b2

    def second_moment_(self, v, sq):
        v.add_(sq)


def optimizer_class(name):
    """The ServerOptimizer class `server.optimizer = name` stands for: fedmpi's own, or a plug-in (an entry
    point of `fedmpi.server_optimizers` or `package.module:Class`, fedmpi.core.plugin_names;
    docs/how-to/own-algorithm.md walk-through 5), held to its declarations (ConfigError naming the key)."""
    if name in OPTIMIZERS:
        return OPTIMIZERS[name]
    cls = plugin_names.resolve(name, "fedmpi.server_optimizers", "server.optimizer")
    where = f"server.optimizer = {name!r}"
    if not (isinstance(cls, type) and issubclass(cls, ServerOptimizer)):
        raise ConfigError(f"{where}: {cls!r} is not a subclass of fedmpi.round.server_opt.ServerOptimizer")
    if cls.__abstractmethods__:
        raise ConfigError(f"{where}: {cls.__name__} does not define {', '.join(sorted(cls.__abstractmethods__))}")
    if not (cls.uses is None or (isinstance(cls.uses, tuple) and set(cls.uses) <= set(UNUSED_CHECKED))):
        raise ConfigError(f"{where}: {cls.__name__}.uses must be None or a tuple of {', '.join(UNUSED_CHECKED)}")
    return cls


def check_optimizer(server_cfg):
    """Every rank at set-up (the server alone builds the optimizer, but a refusal must end every rank alike):
    the plug-in loads, keeps its declarations and is given no key it does not read."""
    cls = optimizer_class(server_cfg.optimizer)
    if server_cfg.optimizer not in OPTIMIZERS and cls.uses is not None:     # fedmpi's own: checked with the config
        c = Checks("server")
        server_cfg._check_unused(c, cls.uses)
        c.done()


def build_optimizer(server_cfg, dim, n_params) -> ServerOptimizer:
    return optimizer_class(server_cfg.optimizer)(server_cfg, dim, n_params)
