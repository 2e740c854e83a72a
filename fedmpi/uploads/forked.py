"""Privacy figures of a fork (`--fork-from OLD_OUT@R`) whose parent ran without the mechanism the fork turns
on: the model after round R already holds R rounds of updates that no noise covers, so no epsilon bounds the
released model. Such a run records the whole model's epsilon as infinite, says why, and reports beside it
the epsilon of the rounds that did have the mechanism (R..T-1); its per-round /metrics/epsilon counts those
rounds only (round t: t - R + 1 noised rounds). A parent that ran the same mechanism keeps today's
accounting over all T rounds (the fork continues its noise multiplier from the checkpoint)."""

from __future__ import annotations

import math


class ForkAccounting:
    """What a stage with an epsilon curve records once it knows the fork's round (None: not a fork, or a
    parent that ran the mechanism). `curve[k]`: epsilon after k + 1 noised rounds."""

    def __init__(self):
        self.fork_round = None

    def forked(self, fork_round, parent_had_it):
        self.fork_round = None if parent_had_it else int(fork_round)

    def at(self, curve, t):
        """Epsilon in the per-round row of round t (0-based)."""
        if self.fork_round is None:
            return float(curve[t])
        return float(curve[t - self.fork_round]) if t >= self.fork_round else math.inf

    def attrs(self, prefix, curve, whole):
        """The run attributes: `{prefix}_epsilon` for the whole model (`whole` unless a fork made it
        unbounded), with `{prefix}_epsilon_rounds` and `{prefix}_epsilon_note` for such a fork."""
        if self.fork_round is None:
            return {f"{prefix}_epsilon": whole}
        noised = len(curve) - self.fork_round
        own = float(curve[noised - 1]) if noised > 0 else 0.0
        return {f"{prefix}_epsilon": math.inf, f"{prefix}_epsilon_rounds": own,
                f"{prefix}_epsilon_note": (f"forked at round {self.fork_round} from a parent that ran without "
                                           f"this mechanism: its {self.fork_round} rounds are in the model "
                                           f"unnoised, so no epsilon bounds it (infinite); "
                                           f"{prefix}_epsilon_rounds = {own:.4g} covers rounds "
                                           f"{self.fork_round + 1}..{len(curve)} alone")}


def parent_value(parent_cfg, dotted, default=None):
    """A dotted key of the parent's stored config (parsed YAML), `default` where it is absent."""
    node = parent_cfg or {}
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node
