"""Secure aggregation clips every client's update to `secagg.clip` before it becomes integers; where more than
half of a round's updates were clipped, the secure run computes something else than the unclipped clear-text run
it is meant to stand for. This says so: one line in the log at the first such round, and the run.h5 attribute
`secagg_clip_warning` (kept current as rows are written) naming every such round (1-based) and the clear-text
twin to compare with (the same clip and uniform weights: privacy.mechanism gaussian, privacy.clip = C,
privacy.noise_multiplier = 0, docs/how-to/privacy.md)."""

from __future__ import annotations

import math

from fedmpi.core import console

HALF = 0.5
FIGURE = "secagg_clipped_fraction"
ATTR = "secagg_clip_warning"


class ClipWarning:
    def __init__(self, clip, say=None):
        self.clip, self.rounds = clip, []
        self.say = say or (lambda line: console.say(line))

    def see(self, round_, metrics) -> bool:
        """Round `round_`'s row (0-based, as /metrics); True when it adds a round to the warning."""
        share = metrics.get(FIGURE, math.nan)
        if not (isinstance(share, (int, float)) and share > HALF):
            return False
        self.rounds.append(round_ + 1)
        if len(self.rounds) == 1:
            self.say(f"fedmpi: warning: round {round_ + 1}: {share:.0%} of the updates were clipped to secagg.clip "
                     f"= {self.clip:g} before masking (more than half): this secure run is not the unclipped "
                     f"clear-text run; compare it with its clear-text twin (privacy: {{mechanism: gaussian, clip: "
                     f"{self.clip:g}, noise_multiplier: 0}}) or raise secagg.clip (further rounds: run.h5's "
                     f"{ATTR})")
        return True

    def text(self):
        rounds = ", ".join(map(str, self.rounds[:50])) + (", ..." if len(self.rounds) > 50 else "")
        return (f"more than half of the updates clipped to secagg.clip = {self.clip:g} in {len(self.rounds)} "
                f"round(s): {rounds}")
