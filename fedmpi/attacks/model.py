"""Client-side model poisoning: what a malicious client uploads in place of its update.

Pure functions of the client's honest update Delta = y_i - x_t (a float32 vector); the upload stage
(fedmpi.attacks.stage) applies the one the config names to each malicious client's update before upload.

  sign_flip  -scale * Delta           (scale 1: the plain sign flip of Damaskinos et al. / FedML's "reverse")
  gaussian   N(0, sigma^2) per entry   in place of Delta (Blanchard et al. 2017's Gaussian Byzantine worker)
  scaling    scale * Delta            (model replacement, Bagdasaryan et al. 2020; also the backdoor's boost)

The gaussian noise comes from the client's own stream (seed, ATTACK, round, client, GAUSSIAN_DRAW), drawn
in numpy on the CPU, so the same client uploads the same noise at every -n and on any device.
"""

from __future__ import annotations

import numpy as np
import torch

from fedmpi.core import rng

GAUSSIAN_DRAW = 1      # the key after (seed, ATTACK, round, client) of the gaussian attack's noise


def sign_flip(update: torch.Tensor, scale=1.0) -> torch.Tensor:
    return update * -scale


def scaling(update: torch.Tensor, scale) -> torch.Tensor:
    return update * scale


def gaussian(update: torch.Tensor, sigma, g: np.random.Generator) -> torch.Tensor:
    """N(0, sigma^2) noise of the update's shape (the update itself is discarded)."""
    noise = g.standard_normal(update.numel(), dtype=np.float32) * np.float32(sigma)
    return torch.from_numpy(noise).to(update.device).view_as(update)


def poisoned_update(attack, update, seed, t, cid) -> torch.Tensor:
    """The update a malicious client `cid` uploads in round t under `attack` (a model attack, or a backdoor,
    whose boost is attack.scale)."""
    name = attack.name
    if name == "sign_flip":
        return sign_flip(update, attack.scale)
    if name in ("scaling", "backdoor"):
        return scaling(update, attack.scale)
    if name == "gaussian":
        return gaussian(update, attack.sigma, rng.stream(seed, rng.ATTACK, t, int(cid), GAUSSIAN_DRAW))
    raise ValueError(f"attack.name = {name!r} is not a client-side model attack")
