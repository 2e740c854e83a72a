"""Adversarial clients: the malicious set, data poisoning and model poisoning."""

from __future__ import annotations

import numpy as np

from fedmpi.core.errors import ConfigError


def malicious_clients(attack, num_clients, seed) -> np.ndarray:
    """The run's malicious client ids, sorted: `attack.clients`, or round(fraction * N) clients drawn once
    from the seed's own stream (the same at every -n and after a resume); empty without an attack."""
    if attack.name == "none":
        return np.zeros(0, dtype=np.int64)
    if attack.clients:
        ids = np.array(sorted(set(attack.clients)), dtype=np.int64)
        if ids[-1] >= num_clients:
            raise ConfigError(f"attack.clients: client {int(ids[-1])} does not exist "
                              f"(partition.clients = {num_clients}: ids 0..{num_clients - 1})")
        return ids
    from fedmpi.core import rng  # here: fedmpi.config imports this package (for .keys), and rng imports torch

    count = int(round(attack.fraction * num_clients))
    g = rng.stream(seed, rng.ATTACK)
    return np.sort(g.choice(num_clients, size=count, replace=False)).astype(np.int64)


def no_malicious_note(attack, malicious, num_clients):
    """The warning a run with an attack but no malicious client records (in its log and run.h5's attribute
    `attack_note`), or None: such a run is attack-free under the attack's name, as a sweep's
    `attack.fraction: 0` point means it to be, or by a fraction too small for the clients."""
    if attack.name == "none" or len(malicious):
        return None
    return (f"attack.name = {attack.name!r} with attack.fraction = {attack.fraction:g} of partition.clients = "
            f"{num_clients}: round({attack.fraction:g} x {num_clients}) = 0 malicious clients, so this run is "
            f"attack-free; at least 1 / {num_clients} = {1 / num_clients:.3g} selects one")


class Recorded(dict):
    """Datasets of a run.h5 group (name -> array) with the group's attributes in `attrs`."""

    def __init__(self, datasets, attrs):
        super().__init__(datasets)
        self.attrs = dict(attrs)


def record(attack, malicious) -> Recorded:
    """/attack in run.h5: the malicious ids (`malicious`) with the attack's name and keys as attributes
    (lists as arrays, a null `z` as NaN), so that a report reads what attacked without the config."""
    attrs = {}
    for key, value in vars(attack).items():
        if value is None:
            value = float("nan")
        elif isinstance(value, tuple):
            value = np.asarray(value, dtype=np.int64)
        attrs[key] = value
    return Recorded({"malicious": np.asarray(malicious, dtype=np.int64)}, attrs)
