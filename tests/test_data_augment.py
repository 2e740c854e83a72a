"""CIFAR pad-crop-flip on tensors: what it computes, and that the client's generator alone decides it."""

import numpy as np
import torch
import torch.nn.functional as F

from fedmpi.config import ClientConfig, DataConfig, ModelConfig
from fedmpi.core.flat import FlatModel
from fedmpi.core.models import build_model
from fedmpi.core.train import LocalTrainer, Schedule
from fedmpi.data.augment import make_transform, pad_crop_flip


def images(n=8, c=3, side=32, seed=0):
    return torch.randn(n, c, side, side, generator=torch.Generator().manual_seed(seed))


def reference(x, dy, dx, flip, pad=4):
    """One image the slow obvious way: zero-pad, crop at (dy, dx), maybe mirror."""
    h, w = x.shape[-2:]
    crop = F.pad(x, (pad, pad, pad, pad))[:, dy:dy + h, dx:dx + w]
    return crop.flip(-1) if flip else crop


def test_each_image_is_its_own_crop_and_flip():
    x = images()
    g = np.random.default_rng(3)
    out = pad_crop_flip(x, g)
    replay = np.random.default_rng(3)
    offsets, flips = replay.integers(0, 9, size=(2, len(x))), replay.random(len(x)) < 0.5
    assert out.shape == x.shape and out.is_contiguous()
    for i in range(len(x)):
        assert torch.equal(out[i], reference(x[i], offsets[0, i], offsets[1, i], flips[i])), i
    assert 0 < flips.sum() < len(x)      # the seed exercises both branches


def test_same_generator_state_same_batch_other_state_other_batch():
    x = images()
    a = pad_crop_flip(x, np.random.default_rng(1))
    b = pad_crop_flip(x, np.random.default_rng(1))
    c = pad_crop_flip(x, np.random.default_rng(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_transform_only_when_asked_for():
    assert make_transform(DataConfig(augment=False), (3, 32, 32)) is None
    assert make_transform(DataConfig(augment=True), (3, 32, 32)) is pad_crop_flip


def test_augmented_training_is_repeatable_and_differs_from_plain():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    x, y = images(n=20, seed=1), torch.arange(20) % 10

    def train(transform, seed=0):
        torch.manual_seed(0)
        flat = FlatModel(build_model(ModelConfig(name="simple_cnn"), (3, 32, 32), 10))
        trainer = LocalTrainer(flat, ClientConfig(lr=0.1, batch_size=5), x, y, transform=transform)
        trainer.train(torch.arange(20), np.random.default_rng(seed), Schedule(5, 4))
        return flat.vec.clone()

    try:
        first, again = train(pad_crop_flip), train(pad_crop_flip)
        plain, other_seed = train(None), train(pad_crop_flip, seed=1)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, again)
    assert not torch.equal(first, plain) and not torch.equal(first, other_seed)
