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

from fedmpi.attacks import malicious_clients
from fedmpi.attacks.keys import OMNISCIENT_ATTACKS
from fedmpi.core import schedules
from fedmpi.robust.catalog import build_rule
from fedmpi.robust.chunks import BYTES_PER_ENTRY, chunk_bounds, chunk_width, default_budget
from fedmpi.round.robust_checks import uses_gather
from fedmpi.round.robust_gather import ChunkedGather, GatherSettings
from fedmpi.round.robust_stage import NormBoundStage


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
