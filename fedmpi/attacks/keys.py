"""The `attack:` config section: which clients are malicious and what they do (docs/how-to/robustness.md).

The malicious set is fixed for the whole run, drawn once from the run's seed (`malicious_clients`), so the
same clients attack at every -n and after a resume. Data poisoning (label_flip, backdoor) changes what the
malicious clients train on; model poisoning changes what they upload. The omniscient model attacks (alie,
ipm, min_max, min_sum) are given the round's benign updates in simulation, which only a protocol that gathers
every client's update can provide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.core.config_checks import Checks, Range, refuse_overridden, refuse_unused

DATA_ATTACKS = ("label_flip", "backdoor")
CLIENT_MODEL_ATTACKS = ("sign_flip", "gaussian", "scaling")
OMNISCIENT_ATTACKS = ("alie", "ipm", "min_max", "min_sum")
ATTACKS = ("none",) + DATA_ATTACKS + CLIENT_MODEL_ATTACKS + OMNISCIENT_ATTACKS

# The keys each attack reads (fedmpi.attacks.data, .model, .omniscient); a key only other attacks read, set
# to a value other than its default, is refused (fedmpi.core.config_checks.refuse_unused). `none` reads none.
_MALICIOUS = ("fraction", "clients")        # who attacks: every attack but none
USES = {"none": (), "label_flip": (*_MALICIOUS, "mapping"),
        "backdoor": (*_MALICIOUS, "target", "poison_fraction", "trigger_size", "scale"),
        "sign_flip": (*_MALICIOUS, "scale"), "gaussian": (*_MALICIOUS, "sigma"), "scaling": (*_MALICIOUS, "scale"),
        "alie": (*_MALICIOUS, "z"), "ipm": (*_MALICIOUS, "epsilon"),
        "min_max": (*_MALICIOUS, "perturbation"), "min_sum": (*_MALICIOUS, "perturbation", "sum_bound")}
# An update of float32 entries times a factor beyond 1e6 overflows for entries above ~3e32 and is a
# replacement by noise in all but name; 1e6 is far above the model-replacement factor clients_per_round.
_FACTOR = 1e6


def _plugin_named(name) -> bool:
    """A plug-in's name (fedmpi.attacks.catalog), imported only at set-up."""
    from fedmpi.core import plugin_names

    return plugin_names.known(name, "fedmpi.attacks")


@dataclass(frozen=True)
class AttackConfig:
    name: str = "none"
    """`none` (no client is malicious), a data attack (label_flip, backdoor), a model attack applied by each
    malicious client to its own update (sign_flip, gaussian, scaling) or an omniscient one computed from the
    round's benign updates (alie, ipm, min_max, min_sum)."""

    fraction: float = 0.2
    """Share of the clients that are malicious, in [0, 1); the set is drawn once from the seed. Refused beside
    `clients`, which names the set instead."""

    clients: tuple[int, ...] = ()
    """Explicit malicious client ids (overrides `fraction`)."""

    mapping: tuple[int, ...] = ()
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

    sum_bound: str = "min"
    """min_sum: the benign sum that bounds the malicious update's sum of squared distances to the benign
    updates: `min`, the smallest sum_j ||b_i - b_j||^2 over the benign i (Shejwalkar and Houmansadr's released
    code, `min_score = torch.min(scores)`), or `max`, the largest (a larger gamma)."""

    RANGES: ClassVar[dict] = {
        "fraction": Range(0, 1, high_open=True),
        "target": Range(0, 2 ** 31 - 1, "a label of the data set, checked against it at set-up"),
        "poison_fraction": Range(0, 1, low_open=True),
        "trigger_size": Range(1, 4096, "at most the image side or input length, checked at set-up"),
        "scale": Range(-_FACTOR, _FACTOR), "sigma": Range(0, _FACTOR), "epsilon": Range(0, _FACTOR, low_open=True),
        # z_max of Baruch et al. is Phi^-1 of a probability: below 9 for any cohort float64 can tell apart
        "z": Range(0, 100, low_open=True)}

    def __post_init__(self):
        # YAML gives lists; the frozen section keeps tuples, so that a config read back equals the one written.
        for key in ("clients", "mapping"):
            value = getattr(self, key)
            if isinstance(value, list):
                object.__setattr__(self, key, tuple(value))
        c = Checks("attack")
        c.require(self.name in ATTACKS or _plugin_named(self.name), "name", self.name,
                  f"must be one of {', '.join(ATTACKS)}, or a plug-in model attack ('package.module:Class')")
        c.require(all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.clients),
                  "clients", self.clients, "must be a list of client ids (non-negative integers)")
        c.require(self.perturbation in ("std", "unit", "sign"), "perturbation", self.perturbation,
                  "must be one of std, unit, sign")
        c.require(self.sum_bound in ("min", "max"), "sum_bound", self.sum_bound, "must be one of min, max")
        if not c.errors:
            refuse_unused(c, self, "name", USES, "attack")
            refuse_overridden(c, self, {"fraction": "clients"})
        c.done()

    @property
    def inert(self):
        return self.name == "none"
