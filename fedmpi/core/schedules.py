"""Learning-rate schedules: pure functions of the round, so that resume and -n invariance hold by construction.

`client.lr_schedule` scales `client.lr` (eta_l) and `server.lr_schedule` scales `server.lr` (eta_g):

    constant      lr
    exponential   lr * gamma^t                         (Zhao et al. decay eta_l by 0.992 per round)
    step          lr * gamma^floor(t / step_rounds)
    cosine        min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2,   T = `rounds` or the run's rounds
(a key the chosen schedule does not read, set to another value than its default, is refused) and, with any
of them, a linear warm-up over the first `warmup_rounds` rounds: factor (t + 1) / warmup_rounds.
The values are logged every round as /metrics/client_lr and /metrics/server_lr.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

from fedmpi.core.config_checks import Checks, Range, count, factor

SCHEDULES = ("constant", "exponential", "step", "cosine")
# The keys each schedule reads (warmup_rounds: all of them). A key another schedule reads, set to a value
# other than its default, is refused: it would change nothing, without a word.
USES = {"constant": (), "exponential": ("gamma",), "step": ("gamma", "step_rounds"), "cosine": ("rounds", "min_lr")}


@dataclass(frozen=True)
class ScheduleConfig:
    """A learning-rate schedule (`client.lr_schedule`, `server.lr_schedule`); a bare name is accepted too."""

    name: str = "constant"
    """constant | exponential | step | cosine."""
    gamma: float = 1.0
    """exponential: factor per round; step: factor per step of `step_rounds` rounds; in (0, 1]."""
    step_rounds: int = 1
    """step: rounds between two decays, in [1, 10^6]."""
    rounds: int | None = None
    """cosine: the horizon T in rounds, in [1, 10^6]; null = the run's `rounds` (then `rounds` may not change on
    --resume)."""
    min_lr: float = 0.0
    """cosine: the learning rate reached at round T, in [0, 1e6]."""
    warmup_rounds: int = 0
    """Linear warm-up: the first rounds scale the rate by (t + 1) / warmup_rounds; 0 = none."""

    RANGES: ClassVar[dict] = {"warmup_rounds": count(0), "gamma": Range(0, 1, low_open=True),
                              "step_rounds": count(), "rounds": count(), "min_lr": factor()}

    def __post_init__(self):
        c = Checks("lr_schedule")
        c.require(self.name in SCHEDULES, "name", self.name, f"must be one of {', '.join(SCHEDULES)}")
        c.require(0 < self.gamma <= 1, "gamma", self.gamma, "must be in (0, 1]")
        c.require(self.step_rounds >= 1, "step_rounds", self.step_rounds, "must be a positive integer")
        c.require(self.rounds is None or self.rounds >= 1, "rounds", self.rounds, "must be a positive integer or null")
        c.require(self.min_lr >= 0, "min_lr", self.min_lr, "must be >= 0")
        c.require(self.warmup_rounds >= 0, "warmup_rounds", self.warmup_rounds, "must be >= 0")
        if not c.errors:        # a bad value is reported once, for its value
            self._check_unused(c)
        c.done()

    def _check_unused(self, c):
        default = {f.name: f.default for f in fields(self)}
        for key in sorted({k for keys in USES.values() for k in keys} - set(USES[self.name])):
            users = [name for name, keys in USES.items() if key in keys]
            c.require(getattr(self, key) == default[key], key, getattr(self, key),
                      f"is not used by the {self.name!r} schedule (only by {' and '.join(users)}); remove it or "
                      f"choose a schedule that uses it")

    @property
    def depends_on_run_length(self) -> bool:
        return self.name == "cosine" and self.rounds is None


def lr_at(base_lr: float, sched: ScheduleConfig, round_: int, run_rounds: int) -> float:
    """The learning rate of round `round_` (0-based)."""
    t = round_
    if sched.name == "exponential":
        lr = base_lr * sched.gamma ** t
    elif sched.name == "step":
        lr = base_lr * sched.gamma ** (t // sched.step_rounds)
    elif sched.name == "cosine":
        horizon = sched.rounds or max(run_rounds, 1)
        lo = min(sched.min_lr, base_lr)
        lr = lo + (base_lr - lo) * (1 + math.cos(math.pi * min(t, horizon) / horizon)) / 2
    else:
        lr = base_lr
    if sched.warmup_rounds and t < sched.warmup_rounds:
        lr *= (t + 1) / sched.warmup_rounds
    return float(lr)


@dataclass(frozen=True)
class LearningRate:
    """One learning rate under its schedule for a run of `run_rounds` rounds: eta_l (`client.lr` under
    `client.lr_schedule`) or eta_g (`server.lr` under `server.lr_schedule`). Built once by the assembler and
    handed to every part that needs the round's rate, so that the rate logged, the rate trained with and the
    rate an algorithm or FLTrust's server update reads are one computation."""

    base: float
    schedule: ScheduleConfig
    run_rounds: int

    @classmethod
    def of(cls, section, run_rounds) -> LearningRate:
        """The rate of a `client` or `server` section (its `lr` and `lr_schedule`)."""
        return cls(section.lr, section.lr_schedule, run_rounds)

    def at(self, round_) -> float:
        """The rate of round `round_` (0-based)."""
        return lr_at(self.base, self.schedule, round_, self.run_rounds)
