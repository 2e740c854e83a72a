"""Training-time augmentation on device tensors: CIFAR's pad-crop-flip, one batch at a time.

The random offsets and flips come from the client's numpy generator (the one that orders its batches), so
an augmented run gives the same result at any `-n` and on any device. The images are already normalised,
so the 4-pixel border is zero: the data set's mean colour rather than black.
"""

from __future__ import annotations

import numpy as np

from fedmpi.core.errors import ConfigError
from fedmpi.core.lazy import F, torch

PAD = 4


def pad_crop_flip(xb: torch.Tensor, g: np.random.Generator, pad=PAD) -> torch.Tensor:
    """Each image of the N x C x H x W batch padded by `pad`, cropped back to H x W at a random offset and
    flipped left-right with probability 1/2."""
    n, _, h, w = xb.shape
    offsets = torch.from_numpy(g.integers(0, 2 * pad + 1, size=(2, n))).to(xb.device)
    flips = torch.from_numpy(g.random(n) < 0.5).to(xb.device)
    padded = F.pad(xb, (pad, pad, pad, pad))
    rows = offsets[0, :, None] + torch.arange(h, device=xb.device)             # [n, h]
    cols = torch.arange(w, device=xb.device).expand(n, w)
    cols = torch.where(flips[:, None], cols.flip(1), cols) + offsets[1, :, None]  # [n, w]
    batch = torch.arange(n, device=xb.device)[:, None, None]
    # Advanced indexing on dims 0, 2, 3 with the channel slice between gives [n, h, w, c].
    return padded[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def make_transform(data_cfg, input_shape):
    """The per-batch transform `data.augment` asks for, or None."""
    if not data_cfg.augment:
        return None
    if len(input_shape) != 3:
        raise ConfigError(f"data.augment = true: pad-crop-flip needs image data (channels, height, width), but "
                          f"data.name = {data_cfg.name!r} has inputs of shape {tuple(input_shape)}; set it false")
    return pad_crop_flip
