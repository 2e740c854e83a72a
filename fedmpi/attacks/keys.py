"""The `attack:` config section: which clients are malicious and what they do (issue 25; docs/robustness.md).

The malicious set is fixed for the whole run, drawn once from the run's seed (`malicious_clients`), so the
same clients attack at every -n and after a resume. Data poisoning (label_flip, backdoor) changes what the
malicious clients train on; model poisoning changes what they upload. The omniscient model attacks (alie,
ipm, min_max, min_sum) are given the round's benign updates in simulation, which only a protocol that gathers
every client's update can provide.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedmpi.core.config_checks import Checks

DATA_ATTACKS = ("label_flip", "backdoor")
CLIENT_MODEL_ATTACKS = ("sign_flip", "gaussian", "scaling")
OMNISCIENT_ATTACKS = ("alie", "ipm", "min_max", "min_sum")
ATTACKS = ("none",) + DATA_ATTACKS + CLIENT_MODEL_ATTACKS + OMNISCIENT_ATTACKS


@dataclass(frozen=True)
class AttackConfig:
    name: str = "none"
    """`none` (no client is malicious), a data attack (label_flip, backdoor), a model attack applied by each
    malicious client to its own update (sign_flip, gaussian, scaling) or an omniscient one computed from the
    round's benign updates (alie, ipm, min_max, min_sum)."""

    fraction: float = 0.2
    """Share of the clients that are malicious, in [0, 1); the set is drawn once from the seed. Ignored when
    `clients` is given."""

    clients: tuple = ()
    """Explicit malicious client ids (overrides `fraction`)."""

    mapping: tuple = ()
    """label_flip: the new label of each label l (its l-th entry: L valid labels, checked against the data
    set at set-up); empty: l -> L-1-l."""

    target: int = 0
    """backdoor: the label a triggered input is to be classified as (a label of the data set)."""

    poison_fraction: float = 0.5
    """backdoor: share of each of a malicious client's batches stamped with the trigger and labelled `target`
    (round(poison_fraction * B) samples of a batch of B, drawn from the client's attack stream)."""

    trigger_size: int = 3
    """backdoor: side of the square pixel patch in the bottom-right corner (images), or the number of last
    features (flat inputs) or tokens (text) the trigger replaces; at most the image side or input length."""

    scale: float = 1.0
    """scaling: the factor on the malicious update (model replacement: about clients_per_round / malicious
    per round); sign_flip: the upload is -scale * update; backdoor: the model-replacement factor on the
    backdoored update (1 = none)."""

    sigma: float = 1.0
    """gaussian: standard deviation of the noise uploaded in place of the update."""

    z: float | None = None
    """alie: the number of standard deviations; null: z_max from n and the number of malicious clients
    (Baruch et al. 2019)."""

    epsilon: float = 0.1
    """ipm: the malicious update is -epsilon times the mean benign update (Xie et al. 2020)."""

    perturbation: str = "std"
    """min_max, min_sum: the direction subtracted from the benign mean: `std` (coordinate-wise standard
    deviation), `unit` (the mean's unit vector) or `sign` (its sign) (Shejwalkar and Houmansadr 2021)."""

    def __post_init__(self):
        # YAML gives lists; the frozen section keeps tuples, so that a config read back equals the one written.
        for key in ("clients", "mapping"):
            value = getattr(self, key)
            if isinstance(value, list):
                object.__setattr__(self, key, tuple(value))
        c = Checks("attack")
        c.require(isinstance(self.clients, tuple) and isinstance(self.mapping, tuple), "clients",
                  self.clients, "clients and mapping must be lists of integers")
        c.require(self.name in ATTACKS, "name", self.name, f"must be one of {', '.join(ATTACKS)}")
        c.require(0 <= self.fraction < 1, "fraction", self.fraction, "must be in [0, 1)")
        c.require(all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in tuple(self.clients)),
                  "clients", self.clients, "must be a list of client ids (non-negative integers)")
        c.require(0 < self.poison_fraction <= 1, "poison_fraction", self.poison_fraction, "must be in (0, 1]")
        c.require(self.trigger_size >= 1, "trigger_size", self.trigger_size, "must be a positive integer")
        c.require(self.sigma >= 0, "sigma", self.sigma, "must be >= 0")
        c.require(self.z is None or self.z > 0, "z", self.z, "must be > 0 or null")
        c.require(self.epsilon > 0, "epsilon", self.epsilon, "must be > 0")
        c.require(self.perturbation in ("std", "unit", "sign"), "perturbation", self.perturbation,
                  "must be one of std, unit, sign")
        c.done()

    @property
    def inert(self):
        return self.name == "none"
