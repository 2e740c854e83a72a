"""The `unlearning:` config section: a run that replays an original run without some clients' contribution.

    unlearning:
      method: federaser          # none (default): an ordinary run
      original: runs/original    # the original run's folder, recorded with checkpoint.updates: true
      every: 2                   # the original's rounds 0, 2, 4, ... are replayed (FedEraser's interval)
    counterfactual:
      drop: [3]                  # the client to forget: it trains, but its update never counts
    client:
      steps: 5                   # fewer local steps than the original's (FedEraser's calibration ratio)

FedEraser (Liu et al., IWQoS 2021): calibration round j starts from the unlearned model M'_j; each remaining
client trains briefly from it, and its update U'_k is rescaled to the length of its recorded update U_k at
original round j * every, |U_k| U'_k / |U'_k|; the server averages the rescaled updates as FedAvg does. At the
default (method: none) the section changes nothing and stays out of the config hash.
"""

from dataclasses import dataclass
from typing import ClassVar, Literal

from fedmpi.core.config_checks import Checks, count


@dataclass(frozen=True)
class UnlearningConfig:
    method: Literal["none", "federaser"] = "none"
    """none: an ordinary run; federaser: FedEraser's calibrated replay of `original` (each counted client's
    update rescaled to the norm of its recorded update at original round round * every). Needs a reduce
    algorithm and full participation (server.clients_per_round = partition.clients); the clients to forget
    are left out with counterfactual.drop."""
    original: str | None = None
    """The original run's folder, holding the updates it recorded (checkpoint.updates: true in that run)."""
    every: int = 1
    """FedEraser's interval: calibration round j replays original round j * every, so a run of R rounds needs
    an original of at least (R - 1) * every + 1 recorded rounds."""

    RANGES: ClassVar[dict] = {"every": count()}

    @property
    def inert(self):
        return self.method == "none"

    def __post_init__(self):
        c = Checks("unlearning")
        c.choice("method", self.method, ("none", "federaser"))
        c.require(isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 1, "every",
                  self.every, "must be a positive integer (original rounds per calibration round)")
        c.require(self.original is None or (isinstance(self.original, str) and bool(self.original)), "original",
                  self.original, "must be the original run's folder, or null")
        c.require(self.method != "federaser" or self.original is not None, "original", self.original,
                  "method federaser replays a recorded run: set unlearning.original to its folder")
        c.require(self.method != "none" or self.original is None, "original", self.original,
                  "is read by unlearning.method: federaser only; set the method, or remove original")
        c.done()
