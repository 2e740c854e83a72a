"""Set-up of robust aggregation (server.aggregator) and the omniscient attacks: what a config may combine,
and the protocol family or upload stage that runs it (fedmpi.round.robust_gather, robust_stage).

Refused at set-up, exit 2, before any file is written: a robust aggregator or an omniscient attack with an
algorithm that does not declare `robust_aggregation` (its upload is not one vector averaged by weight),
with differential privacy (its noise is calibrated to a sum, not to a robust rule), with
eval.client_drift (the drift figures need the reduced sums); a rule that needs the server's update (fltrust)
without the server's set.
"""

from __future__ import annotations

import functools

from fedmpi.algorithms.registry import REGISTRY
from fedmpi.attacks import malicious_clients
from fedmpi.attacks.keys import OMNISCIENT_ATTACKS
from fedmpi.core import schedules
from fedmpi.core.config_checks import Checks
from fedmpi.robust.catalog import build_rule, rule_class, unused_key_problems
from fedmpi.robust.chunks import BYTES_PER_ENTRY, chunk_bounds, chunk_width, default_budget
from fedmpi.round.robust_gather import ChunkedGather, GatherSettings, uses_gather
from fedmpi.round.robust_stage import NormBoundStage


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


def robust_stage(cfg, dim):
    """norm_bound under the plain reduction: the upload stage that clips each update; else None."""
    if cfg.server.aggregator == "norm_bound" and not uses_gather(cfg):
        return NormBoundStage(cfg.server.robust, dim)
    return None


def robust_protocol(cfg, num_clients, server_trainer=None):
    """The chunked gather family configured for this run, or None where the plain reduction serves."""
    if not uses_gather(cfg):
        return None
    omniscient = cfg.attack.name in OMNISCIENT_ATTACKS
    budget = cfg.runtime.gather_bytes
    settings = GatherSettings(
        rule=build_rule(cfg.server.aggregator, cfg.server.robust),
        budget=default_budget() if budget is None else budget,
        malicious=malicious_clients(cfg.attack, num_clients, cfg.seed),
        attack=cfg.attack if omniscient else None,
        server_trainer=server_trainer, client_cfg=cfg.client,
        client_lr=functools.partial(schedules.client_lr, cfg))
    return ChunkedGather(settings)


def dry_run_line(cfg, dim) -> str:
    """`--dry-run`'s line on the chunked gather (empty where the run does not use it): the chunks a full round
    of server.clients_per_round counted clients is cut into, and rank 0's bound for them."""
    if not uses_gather(cfg):
        return ""
    budget = cfg.runtime.gather_bytes
    budget = default_budget() if budget is None else budget
    s = cfg.server.clients_per_round
    width = chunk_width(budget, s, dim)
    passes = build_rule(cfg.server.aggregator, cfg.server.robust).passes()
    return (f"robust aggregation: {cfg.server.aggregator} through the chunked gather, {passes} pass(es) (+1 for "
            f"min_max/min_sum) over {len(chunk_bounds(dim, width))} chunk(s) of {width} coordinates for {s} "
            f"clients; rank 0 holds {s * width * BYTES_PER_ENTRY / 1e6:.1f} MB for a chunk "
            f"(runtime.gather_memory {budget / 1e6:.0f} MB)")
