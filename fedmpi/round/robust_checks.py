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


def robust_active(aggregator, attack_name) -> bool:
    """Whether server.aggregator = `aggregator` or attack.name = `attack_name` asks for robust aggregation."""
    return aggregator != "mean" or attack_name in OMNISCIENT_ATTACKS


def check_robust(algo_cls, *, server, attack, algorithm_name, privacy, client_drift, server_data):
    """ConfigError for a combination robust aggregation cannot run (module docstring), from the `server`,
    `attack`, `privacy` and `server_data` sections, algorithm.name and eval.client_drift."""
    aggregator, attack_name = server.aggregator, attack.name
    if not robust_active(aggregator, attack_name):
        return
    c = Checks("")
    what = (f"server.aggregator = {aggregator!r}" if aggregator != "mean"
            else f"attack.name = {attack_name!r} (an omniscient attack, run through the gather)")
    c.require(algo_cls.robust_aggregation, "server.aggregator" if aggregator != "mean" else "attack.name",
              aggregator if aggregator != "mean" else attack_name,
              f"{'an omniscient attack runs through the gather and ' if aggregator == 'mean' else ''}needs an "
              f"algorithm whose upload is one vector averaged by weight; algorithm.name = "
              f"{algorithm_name!r} is not one (it does not declare robust_aggregation); use one of "
              f"{', '.join(name for name, cls in REGISTRY.items() if cls.robust_aggregation)}")
    c.require(not privacy.enabled, "privacy.mechanism", privacy.mechanism,
              f"{what} cannot run with differential privacy (its noise is calibrated to the clipped sum); "
              f"set privacy.mechanism: none")
    c.require(not (client_drift and uses_gather(aggregator, attack_name)), "eval.client_drift", client_drift,
              f"the drift figures need the reduced sums, which {what} does not form; set eval.client_drift: false")
    c.require(not rule_class(aggregator).needs_server_update or server_data.wanted, "server_data.size",
              server_data.size, f"server.aggregator = {aggregator!r} needs the server's own set for its update: "
              f"set server_data.size > 0 (or server_data.fraction > 0)")
    c.errors.extend(unused_key_problems(aggregator, server.robust))
    c.done()


def uses_gather(aggregator, attack_name) -> bool:
    """Whether the run's uploads go through the chunked gather (server.aggregator = `aggregator`, attack.name =
    `attack_name`): a robust rule that needs every update, or an omniscient attack (which needs the benign
    ones; with aggregator mean the gather computes the mean)."""
    return attack_name in OMNISCIENT_ATTACKS or aggregator not in ("mean", "norm_bound")
