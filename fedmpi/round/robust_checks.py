"""What robust aggregation (server.aggregator) and the omniscient attacks may be combined with, as pure rules
on the config (no torch): fedmpi.run.resolve asks them; fedmpi.round.robust_setup builds what they allow.

Refused at set-up, exit 2, before any file is written: a robust aggregator or an omniscient attack with an
algorithm that does not declare `robust_aggregation` (its upload is not one vector averaged by weight),
with differential privacy (its noise is calibrated to a sum, not to a robust rule), with
eval.client_drift (the drift figures need the reduced sums); a rule that needs the server's update (fltrust)
without the server's set.
"""

from __future__ import annotations

from fedmpi.algorithms.registry import REGISTRY
from fedmpi.attacks.keys import OMNISCIENT_ATTACKS
from fedmpi.core.config_checks import Checks
from fedmpi.robust.catalog import rule_class, unused_key_problems


def robust_active(cfg) -> bool:
    return cfg.server.aggregator != "mean" or cfg.attack.name in OMNISCIENT_ATTACKS


def check_robust(cfg, algo_cls):
    """ConfigError for a combination robust aggregation cannot run (module docstring)."""
    if not robust_active(cfg):
        return
    c = Checks("")
    aggregator, attack = cfg.server.aggregator, cfg.attack.name
    what = (f"server.aggregator = {aggregator!r}" if aggregator != "mean"
            else f"attack.name = {attack!r} (an omniscient attack, run through the gather)")
    c.require(algo_cls.robust_aggregation, "server.aggregator" if aggregator != "mean" else "attack.name",
              aggregator if aggregator != "mean" else attack,
              f"{'an omniscient attack runs through the gather and ' if aggregator == 'mean' else ''}needs an "
              f"algorithm whose upload is one vector averaged by weight; algorithm.name = "
              f"{cfg.algorithm.name!r} is not one (it does not declare robust_aggregation); use one of "
              f"{', '.join(name for name, cls in REGISTRY.items() if cls.robust_aggregation)}")
    c.require(not cfg.privacy.enabled, "privacy.mechanism", cfg.privacy.mechanism,
              f"{what} cannot run with differential privacy (its noise is calibrated to the clipped sum); "
              f"set privacy.mechanism: none")
    c.require(not (cfg.eval.client_drift and uses_gather(cfg)), "eval.client_drift", cfg.eval.client_drift,
              f"the drift figures need the reduced sums, which {what} does not form; set eval.client_drift: false")
    c.require(not rule_class(aggregator).needs_server_update or cfg.server_data.wanted, "server_data.size",
              cfg.server_data.size, f"server.aggregator = {aggregator!r} needs the server's own set for its update: "
              f"set server_data.size > 0 (or server_data.fraction > 0)")
    c.errors.extend(unused_key_problems(aggregator, cfg.server.robust))
    c.done()


def uses_gather(cfg) -> bool:
    """Whether the run's uploads go through the chunked gather: a robust rule that needs every update, or an
    omniscient attack (which needs the benign ones; with aggregator mean the gather computes the mean)."""
    omniscient = cfg.attack.name in OMNISCIENT_ATTACKS
    return omniscient or cfg.server.aggregator not in ("mean", "norm_bound")
