"""The `counterfactual:` config section: how a run differs from its original, and nothing else.

    counterfactual:
      of: runs/original          # the original run's folder (recorded in run.h5; not part of the config hash)
      drop: [3]                  # selected as in the original; their uploads never count
      remove: [5]                # not in the population: the selection is redrawn among the others

Every random choice is keyed by (seed, round, client), so dropping a client's uploads leaves every other
client's batches, every selection and every noise draw as they were: the model differs from the original
by the dropped client's contribution only. Removing a client changes the rounds' selections, which the run
says. A change from round r on is a fork (`--fork-from ORIGINAL@r`) with these keys. At the defaults the
section changes nothing and stays out of the config hash.
"""

import os
from dataclasses import dataclass
from typing import ClassVar

from fedmpi.core.config_checks import Checks, count


def _client_ids(value):
    return all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)


@dataclass(frozen=True)
class CounterfactualConfig:
    of: str | None = None
    """The original run's folder, recorded in run.h5 as `counterfactual_of` (it changes no result, so it is
    not part of the config hash); null: a run with no declared original."""
    drop: tuple[int, ...] = ()
    """Client ids whose uploads never count: each is selected and trains as in the original (its batches
    unchanged), but its update and its state are lost as a dropped-out client's are; the round's average is
    over the other counted clients."""
    remove: tuple[int, ...] = ()
    """Client ids taken out of the population: never selected, the round's clients drawn among the others
    (the draw is over fewer clients, so every round's selection may differ from the original's)."""
    from_round: int = 0
    """The first round (0-based) the change applies to; the rounds before it are the original's. A fork from
    the original's checkpoint at this round (`--fork-from ORIGINAL@R`, or a sweep's `fork_from`) gives the
    same model bit for bit without recomputing them."""

    RANGES: ClassVar[dict] = {"from_round": count(0)}

    @property
    def inert(self):
        return not self.drop and not self.remove

    @property
    def change(self) -> str:
        """The change in words, as run.h5's `counterfactual_change` records it ('' when there is none)."""
        parts = []
        if self.drop:
            parts.append(f"drop {list(self.drop)}")
        if self.remove:
            parts.append(f"remove {list(self.remove)}")
        return "; ".join(parts)

    def run_attrs(self, fork_round=None) -> dict:
        """run.h5's root attributes of a counterfactual: `counterfactual_of` (the original's folder, absolute) and
        `counterfactual_change` (the change in words, with the round it starts from when the run is a fork);
        none for a run that declares no original and no change."""
        if self.of is None and self.inert:
            return {}
        change = self.change or "none"
        start = max(self.from_round, fork_round or 0)
        if start:
            change += f" from round {start}"
        return {"counterfactual_of": os.path.abspath(self.of) if self.of else "", "counterfactual_change": change}

    def __post_init__(self):
        # YAML gives lists; the frozen section keeps sorted tuples, so that a config read back equals the one written.
        for key in ("drop", "remove"):
            value = getattr(self, key)
            if isinstance(value, (list, tuple)) and _client_ids(value):
                object.__setattr__(self, key, tuple(sorted(set(value))))
        c = Checks("counterfactual")
        for key in ("drop", "remove"):
            c.require(_client_ids(getattr(self, key)), key, getattr(self, key),
                      "must be a list of client ids (non-negative integers)")
        c.require(not set(self.drop) & set(self.remove), "drop", list(self.drop),
                  f"names clients also in remove ({sorted(set(self.drop) & set(self.remove))}); a client is either "
                  f"dropped or removed")
        c.require(isinstance(self.from_round, int) and not isinstance(self.from_round, bool) and self.from_round >= 0,
                  "from_round", self.from_round, "must be a round number >= 0")
        c.require(self.of is None or (isinstance(self.of, str) and bool(self.of)), "of", self.of,
                  "must be the original run's folder, or null")
        c.done()
