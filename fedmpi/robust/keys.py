"""The `server.robust:` subsection: the keys of the robust aggregators (`server.aggregator`; docs/how-to/robustness.md).

`server.aggregator` names the rule (fedmpi.robust.rules); these are its parameters. Each rule reads only some
of them (`USES`); a key the chosen rule does not read, set to a value other than its default, is refused, as
the server optimizer's unused keys are. Conditions that need the round's size (Krum's n > 2f + 2, Bulyan's
n >= 4f + 3) are checked against server.clients_per_round by ServerConfig, where both are known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.core.config_checks import MAX_CLIENTS, Checks, Range, factor

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "geomed", "centered_clip",
               "norm_bound", "fltrust")

# The keys each aggregator reads (the `name` of the check is server.aggregator, passed in by ServerConfig).
USES = {
    "mean": ("weighted",),
    "median": (),
    "trimmed_mean": ("beta",),
    "krum": ("f",),
    "multi_krum": ("f", "m", "weighted"),
    "bulyan": ("f", "min_neighbours"),
    "geomed": ("iterations", "nu", "weighted"),
    "centered_clip": ("iterations", "tau", "weighted"),
    "norm_bound": ("bound", "weighted"),
    "fltrust": (),
}


MAX_ITERATIONS = 100      # server.robust.iterations


@dataclass(frozen=True)
class RobustConfig:
    beta: float = 0.1
    """trimmed_mean: the fraction of the round's clients trimmed at each end of every coordinate, in [0, 0.5)
    (k = floor(beta * n) values each side)."""

    f: int = 1
    """krum, multi_krum, bulyan: the number of Byzantine clients per round the rule tolerates."""

    min_neighbours: int = 1
    """bulyan: the fewest closest others each Krum score of its selection sums, max(min_neighbours, n - f - 2),
    0 or 1. 1 as Flower's aggregate_krum; 0 the count as written, under which the last of the theta picks
    ties at f = 1 and goes to the lowest client id (docs/explanation/baselines.md)."""

    m: int | None = None
    """multi_krum: how many of the best-scored clients are averaged; null: n - f."""

    iterations: int = 3
    """geomed: smoothed Weiszfeld updates after the starting mean; centered_clip: clipping iterations.
    A fixed count: every rank iterates the same chunk schedule, one pass per iteration, in [1, 100]: each is a
    pass over every update of the round (a chunked gather where they exceed memory), so the bound keeps one
    round's work bounded; the rules' authors use 1 to 5."""

    nu: float = 1e-5
    """geomed: the smoothing of the Weiszfeld weights, alpha_i / max(nu, ||z - u_i||) (Pillutla et al.),
    in (0, 1e6]."""

    tau: float = 1.0
    """centered_clip: the clipping radius around the current centre (Karimireddy et al. 2021), in (0, 1e6]."""

    bound: float = 1.0
    """norm_bound: the largest L2 norm an update keeps, in (0, 1e6]; longer ones are scaled down to it."""

    weighted: bool = True
    """mean, multi_krum, geomed, centered_clip, norm_bound: weight clients by their sample counts (FedAvg's
    p_i); false: every counted client alike."""

    # The declared bounds (fedmpi.core.config_checks.Range); nu, tau and bound are lengths of float32 updates.
    RANGES: ClassVar[dict] = {
        "beta": Range(0, 0.5, "half or more would trim every value", high_open=True),
        "f": Range(0, MAX_CLIENTS), "m": Range(1, MAX_CLIENTS), "min_neighbours": Range(0, 1),
        "iterations": Range(1, MAX_ITERATIONS, f"at most {MAX_ITERATIONS}: each is a pass over the round's "
                                               f"updates; the rules' authors use 1 to 5"),
        "nu": factor(low_open=True), "tau": factor(low_open=True), "bound": factor(low_open=True)}

    def problems(self, aggregator, clients_per_round):
        """The errors of these keys for `aggregator` with rounds of `clients_per_round` clients (dotted under
        server.robust), as a list of messages."""
        c = Checks("server.robust")
        c.require(0 <= self.beta < 0.5, "beta", self.beta, "must be in [0, 0.5): half or more would trim every value")
        c.require(isinstance(self.f, int) and self.f >= 0, "f", self.f, "must be a non-negative integer")
        c.require(self.min_neighbours in (0, 1), "min_neighbours", self.min_neighbours,
                  "must be 0 (n - f - 2 as written) or 1 (at least one, Flower's)")
        c.require(self.m is None or self.m >= 1, "m", self.m, "must be a positive integer or null")
        c.require(self.iterations >= 1, "iterations", self.iterations, "must be a positive integer")
        c.require(self.nu > 0, "nu", self.nu, "must be > 0")
        c.require(self.tau > 0, "tau", self.tau, "must be > 0")
        c.require(self.bound > 0, "bound", self.bound, "must be > 0")
        n, f = clients_per_round, self.f
        if not c.errors:
            if aggregator in ("krum", "multi_krum"):
                c.require(n > 2 * f + 2, "f", f, f"{aggregator} needs n > 2f + 2 clients per round: with "
                          f"server.clients_per_round = {n}, f must be <= {max((n - 3) // 2, 0)}")
            if aggregator == "multi_krum" and self.m is not None:
                c.require(self.m <= n - f, "m", self.m, f"must be <= n - f = {n - f} "
                          f"(server.clients_per_round - server.robust.f)")
            if aggregator == "bulyan":
                c.require(n >= 4 * f + 3, "f", f, f"bulyan needs n >= 4f + 3 clients per round: with "
                          f"server.clients_per_round = {n}, f must be <= {max((n - 3) // 4, 0)}")
            if aggregator in USES:      # a plug-in's keys: once it is imported (fedmpi.robust.catalog)
                _refuse_unused(c, self, aggregator)
        return c.errors


def _refuse_unused(c, keys, aggregator, uses=USES):
    """A key only other aggregators read, set to a value other than its default, would change nothing. `uses`:
    USES with a plug-in's declaration added (fedmpi.robust.catalog)."""
    defaults = RobustConfig()
    for key in sorted({k for used in uses.values() for k in used} - set(uses.get(aggregator, ()))):
        users = [name for name, used in uses.items() if key in used]
        c.require(getattr(keys, key) == getattr(defaults, key), key, getattr(keys, key),
                  f"is not used by server.aggregator {aggregator!r} (only by {', '.join(users)}); remove it or "
                  f"choose an aggregator that uses it")


def aggregator_problems(aggregator, keys, clients_per_round) -> list:
    """server.aggregator: one of fedmpi's rules or a plug-in's name (an installed `fedmpi.aggregators` entry
    point or `package.module:Class`, imported only at set-up); then its server.robust keys."""
    from fedmpi.core import plugin_names

    if aggregator not in AGGREGATORS and not plugin_names.known(aggregator, "fedmpi.aggregators"):
        c = Checks("server")
        c.choice("aggregator", aggregator, AGGREGATORS + ("'package.module:Class'",))
        return c.errors
    return keys.problems(aggregator, clients_per_round)
