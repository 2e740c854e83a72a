"""Attack set-ups that cannot run, refused before anything is written (ConfigError, exit 2), each naming the
key and what would be valid. The section's own ranges are checked in fedmpi.attacks.keys; these checks need
the data set (labels, input shape) and the algorithm's declared upload. The omniscient attacks' and the
robust aggregators' own conditions are fedmpi.round.robust_checks.check_robust's (they run through the
chunked gather, which also serves them with server.aggregator = mean)."""

from __future__ import annotations

import numpy as np

from fedmpi.algorithms.base import REDUCE
from fedmpi.attacks import catalog
from fedmpi.attacks.keys import CLIENT_MODEL_ATTACKS, DATA_ATTACKS, OMNISCIENT_ATTACKS


def problems(cfg, algo_cls, dataset) -> list:
    """Why the attack of `cfg` cannot run with this algorithm and data set (`dataset`: its DataShape, from
    fedmpi.data.data_shape), one line each (empty: it can)."""
    attack = cfg.attack
    if attack.inert:
        return []
    found = []
    name = f"attack.name = {attack.name!r}"
    if attack.name in DATA_ATTACKS:
        found += _data_problems(attack, dataset)
    plugin = catalog.is_plugin(attack.name)
    if plugin:
        found += catalog.plugin_problems(attack)
    changes_upload = (attack.name in CLIENT_MODEL_ATTACKS or plugin
                      or (attack.name == "backdoor" and attack.scale != 1))
    if changes_upload:
        what = name if attack.name != "backdoor" else f"{name} with attack.scale = {attack.scale}"
        if algo_cls.protocol != REDUCE:
            found.append(f"{what}: algorithm.name = {cfg.algorithm.name!r} uploads by the "
                         f"{algo_cls.protocol!r} protocol; a malicious client's update is replaced on the "
                         f"upload path of reduce algorithms only (e.g. fedavg, fedprox)")
        elif algo_cls.up_vectors != 1:
            found.append(f"{what}: algorithm.name = {cfg.algorithm.name!r} uploads {algo_cls.up_vectors} "
                         f"vectors per client (up_vectors), and the attack replaces one model update; use an "
                         f"algorithm with one upload vector (fedavg, fedprox, moon, ...)"
                         + (" or attack.scale = 1" if attack.name == "backdoor" else ""))
    if attack.name in OMNISCIENT_ATTACKS:
        found += _omniscient_problems(cfg, name)
    if attack.clients and max(attack.clients) >= cfg.partition.clients:
        found.append(f"attack.clients: client {max(attack.clients)} does not exist (partition.clients = "
                     f"{cfg.partition.clients}: ids 0..{cfg.partition.clients - 1})")
    return found


def _omniscient_problems(cfg, name) -> list:
    """An omniscient attack computes its uploads from every benign update of the round, gathered with the
    clients' sample counts as weights (fedmpi.round.robust_gather): neither a uniform weighting nor secure
    aggregation (the server sees only the masked sum) gives it those; both failed in round 0."""
    found = []
    if cfg.server.weighting != "samples":
        found.append(f"{name} with server.weighting = {cfg.server.weighting!r}: an omniscient attack runs through "
                     f"the gather, which weighs clients by their sample counts; use server.weighting: samples")
    if cfg.server.secure_aggregation != "none":
        found.append(f"{name} with server.secure_aggregation = {cfg.server.secure_aggregation!r}: an omniscient "
                     f"attack needs every client's update, and the server sees only their masked sum; use "
                     f"server.secure_aggregation: none or a client-side attack (sign_flip, gaussian, scaling)")
    return found


def _data_problems(attack, dataset) -> list:
    found = []
    labels = dataset.num_classes
    name = f"attack.name = {attack.name!r}"
    if dataset.real_targets:
        return [f"{name} poisons class labels, but data.name = {dataset.name!r} has real-valued targets; "
                f"use a model attack (sign_flip, gaussian, scaling)"]
    if attack.name == "label_flip" and attack.mapping:
        bad = [v for v in attack.mapping if not (isinstance(v, int) and 0 <= v < labels)]
        if len(attack.mapping) != labels or bad:
            found.append(f"attack.mapping: must list the new label of each of the {labels} labels of "
                         f"data.name = {dataset.name!r} ({labels} integers in 0..{labels - 1}), got "
                         f"{len(attack.mapping)} entries" + (f" with invalid labels {bad[:5]}" if bad else ""))
    if attack.name == "backdoor":
        if not 0 <= attack.target < labels:
            found.append(f"attack.target = {attack.target}: must be a label of data.name = {dataset.name!r} "
                         f"(0..{labels - 1})")
        shape = tuple(dataset.input_shape)
        room = min(shape[-2:]) if len(shape) == 3 else int(np.prod(shape))
        if attack.trigger_size > room:
            kind = "image side" if len(shape) == 3 else "input length"
            found.append(f"attack.trigger_size = {attack.trigger_size}: larger than the {kind} of "
                         f"data.name = {dataset.name!r} (inputs {shape}); use at most {room}")
    return found
