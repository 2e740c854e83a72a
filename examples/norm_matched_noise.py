"""Walk-through 4 of docs/how-to/own-algorithm.md: a model attack in one file, run by
`attack.name: examples.norm_matched_noise:NormMatchedNoise`.

Each malicious client uploads a random direction with the norm of its honest update (times attack.scale):
noise that a norm-based defence (norm_bound, a clipping rule) cannot tell from an honest upload by length.
"""

import torch

from fedmpi.attacks.catalog import ModelAttack


class NormMatchedNoise(ModelAttack):
    name = "norm_matched_noise"
    uses = ("scale",)       # reads attack.scale; any other attack key set (but fraction, clients) is refused

    def poison(self, update, ctx):
        # ctx.rng: this client's own stream for this round, the same at every -n and after a resume
        direction = torch.from_numpy(ctx.rng.standard_normal(update.numel()).astype("float32"))
        direction = direction.to(update.device).view_as(update)
        return direction * (self.keys.scale * update.norm() / direction.norm())
