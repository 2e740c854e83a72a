"""What `server.secure_aggregation` needs of the rest of the config, checked before anything is written:
each problem one line naming the keys and what would be valid (ConfigError, exit 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedmpi.algorithms.base import REDUCE
from fedmpi.secagg.graph import default_neighbours
from fedmpi.secagg.keys import SecAggConfig

NOISE_TAIL = 12         # the field holds the noise sum up to NOISE_TAIL standard deviations (P ~ 1e-32)
SECURITY_NOTE = ("security needs t above half of the share holders (t > S/2 for secagg, t > (k+1)/2 for "
                 "secagg_plus), so that no minority can rebuild a client's secrets")


@dataclass(frozen=True)
class Plan:
    """The protocol's numbers for a config: cohort S (the clients a round selects), degree k (S - 1 for
    secagg), threshold t, the smallest safe field b_min and the integer bound of one entry of the sum."""

    mode: str
    cohort: int
    neighbours: int
    threshold: int
    min_bits: int
    bound: int

    def describe(self) -> str:
        graph = "complete graph" if self.mode == "secagg" else f"{self.neighbours}-regular graph"
        return (f"secure aggregation: {self.mode}, cohort {self.cohort}, {graph}, threshold {self.threshold}, "
                f"field 2^b with b >= {self.min_bits}")


def cohort_size(cfg) -> int:
    return _cohort(cfg.server, cfg.partition)


def _cohort(server, partition) -> int:
    return server.straggler_policy().selected(server.clients_per_round, partition.clients)


def noise_stddev(keys: SecAggConfig) -> float:
    """The standard deviation of the noise in the sum (integer units), 0 without noise."""
    return 0.0 if keys.noise == "none" else keys.noise_multiplier * keys.clip * keys.scale


def plan_of(cfg) -> Plan:
    return plan_for(cfg.secagg, cfg.server, cfg.partition)


def plan_for(keys, server, partition) -> Plan:
    """The protocol's numbers from the `secagg`, `server` and `partition` sections."""
    mode, s = server.secure_aggregation, _cohort(server, partition)
    k = s - 1 if mode == "secagg" else (keys.neighbours if keys.neighbours is not None else default_neighbours(s))
    holders = k + 1
    t = keys.threshold if keys.threshold is not None else holders // 2 + 1
    # One client's entry is at most clip * scale in magnitude, +1 for the rounding up; the noise sum is
    # bounded by NOISE_TAIL of its standard deviations. The sum must lie in [-2^(b-1), 2^(b-1)).
    bound = s * (math.ceil(keys.clip * keys.scale) + 1) + math.ceil(NOISE_TAIL * noise_stddev(keys))
    return Plan(mode, s, k, t, bound.bit_length() + 1, bound)


def problems(cfg, algo_cls) -> list:
    """Every problem of running `cfg` under secure aggregation, one line each (empty when it can run)."""
    mode, keys = cfg.server.secure_aggregation, cfg.secagg
    if mode == "none":
        if keys != SecAggConfig():
            return ["secagg.* is set but server.secure_aggregation is none: set it to secagg or secagg_plus, "
                    "or remove the secagg section"]
        return []
    found = []
    name = cfg.algorithm.name
    if algo_cls.protocol != REDUCE:
        found.append(f"algorithm.name = {name!r} with server.secure_aggregation = {mode!r}: its uploads travel "
                     f"by the {algo_cls.protocol!r} protocol, not as one vector per client summed by the server")
    elif algo_cls.up_vectors != 1:
        found.append(f"algorithm.name = {name!r} with server.secure_aggregation = {mode!r}: each client "
                     f"uploads {algo_cls.up_vectors} vectors; secure aggregation sums one (the model update)")
    elif not algo_cls.uploads_model_delta:
        found.append(f"algorithm.name = {name!r} with server.secure_aggregation = {mode!r}: it does "
                     f"not declare uploads_model_delta (its upload is not the update y_i - x_t, the one vector "
                     f"secure aggregation sums)")
    else:
        found += [f"algorithm.name = {name!r} with server.secure_aggregation = {mode!r}: {why}"
                  for why in algo_cls.privacy_problems(cfg.algorithm, cfg.client.steps)]
    if cohort_size(cfg) < 2:
        found.append(f"server.clients_per_round = {cfg.server.clients_per_round} with "
                     f"server.secure_aggregation: the sum of one client is its update; select at least 2")
    compress = cfg.client.compress.name
    if compress not in ("none", "randk"):
        found.append(f"client.compress.name = {compress!r} with server.secure_aggregation: {compress} keeps "
                     f"client-specific coordinates or scales, which masked vectors cannot sum; use randk "
                     f"(its indices then come from a seed shared by the round's clients) or none")
    if cfg.privacy.enabled:
        found.append("privacy.mechanism = 'gaussian' with server.secure_aggregation: the server sees no single "
                     "update, so it can neither clip one nor add central noise to a sum it should not trust "
                     "itself with; use secagg.noise (distributed DP, added by each client in integers)")
    aggregator = cfg.server.aggregator
    if aggregator != "mean":
        found.append(f"server.aggregator = {aggregator!r} with server.secure_aggregation: a robust aggregator "
                     f"needs the individual updates, and the server sees only their sum; use mean")
    if cfg.server.weighting == "uniform" and keys.weighting == "samples":
        # Under secure aggregation each client's weight is secagg.weighting's (fedmpi.secagg.stage): a
        # server.weighting of uniform beside it would be ignored without a word.
        found.append("server.weighting = 'uniform' with secagg.weighting = 'samples': under secure aggregation "
                     "secagg.weighting decides each client's weight; remove one of the two (uniform: "
                     "secagg.weighting: uniform; by sample count: leave server.weighting at samples)")
    if cfg.server.sampling != "fixed":
        found.append("server.sampling = 'poisson' with server.secure_aggregation: the threshold and the field "
                     "are sized for a fixed cohort; use server.sampling: fixed")
    if found:
        return found
    p = plan_of(cfg)
    if mode == "secagg" and keys.neighbours is not None:
        found.append(f"secagg.neighbours = {keys.neighbours}: only secagg_plus reads it (secagg masks with the "
                     f"whole cohort); remove it or set server.secure_aggregation: secagg_plus")
    if mode == "secagg_plus":
        if p.neighbours > p.cohort - 1 or p.neighbours < 1:
            found.append(f"secagg.neighbours = {p.neighbours}: must be in [1, {p.cohort - 1}] (the cohort of "
                         f"{p.cohort} clients less the client itself)")
        elif p.neighbours % 2 and p.neighbours != p.cohort - 1:
            found.append(f"secagg.neighbours = {p.neighbours}: the Harary graph needs an even degree below the "
                         f"cohort less one ({p.cohort - 1}); use {p.neighbours + 1} or {p.neighbours - 1}")
    holders = p.neighbours + 1
    if not 1 <= p.threshold <= holders:
        what = (f"server.clients_per_round ({p.cohort})" if mode == "secagg"
                else f"the share holders, secagg.neighbours + 1 ({holders})")
        found.append(f"secagg.threshold = {p.threshold}: must be in [1, {holders}], at most {what}; "
                     f"{SECURITY_NOTE}")
    if keys.bits < p.min_bits:
        found.append(f"secagg.bits = {keys.bits}: too small for the clipped sum of {p.cohort} clients (each entry "
                     f"up to clip * scale = {keys.clip * keys.scale:g}"
                     + (f", noise stddev {noise_stddev(keys):g}" if keys.noise != "none" else "")
                     + f"): the sum would wrap silently; needs bits >= {p.min_bits}, or a smaller secagg.scale "
                       f"or secagg.clip")
    return found


def warnings(cfg, algo_cls) -> list:
    """What runs but is weaker than the protocol intends (--dry-run says it)."""
    if cfg.server.secure_aggregation == "none" or problems(cfg, algo_cls):
        return []
    p = plan_of(cfg)
    if p.threshold <= (p.neighbours + 1) / 2:
        return [f"secagg.threshold = {p.threshold} is at most half of the {p.neighbours + 1} share holders: "
                f"{SECURITY_NOTE}"]
    return []

