"""The model zoo on the flat vector: shapes, gradients bound to the flat gradient, conventions, errors."""

import numpy as np
import pytest
import torch
from torch import nn

from fedmpi.config import ClientConfig, ModelConfig
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.core.models import build_model
from fedmpi.core.train import LocalTrainer, Schedule

CASES = [
    ("lr", {}, (1, 28, 28), 10),
    ("mlp", {"hidden": 16}, (1, 28, 28), 10),
    ("cnn_mnist", {}, (1, 28, 28), 10),
    ("cnn2", {}, (1, 28, 28), 45),
    ("cnn2", {}, (3, 32, 32), 10),
    ("simple_cnn", {}, (3, 32, 32), 10),
    ("simple_cnn", {"projection": 32}, (1, 28, 28), 10),
    ("lstm", {}, (80,), 80),
    ("resnet18", {"norm": "group"}, (3, 32, 32), 100),
    ("resnet18", {"norm": "batch"}, (3, 32, 32), 10),
]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def batch(shape, classes, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, classes, (n, *shape), generator=g) if len(shape) == 1 else torch.randn(n, *shape, generator=g)
    return x, torch.randint(0, classes, (n,), generator=g)


def flat_model(name, keys, shape, classes):
    torch.manual_seed(0)
    return FlatModel(build_model(ModelConfig(name=name, **keys), shape, classes))


@pytest.mark.parametrize("name, keys, shape, classes", CASES, ids=lambda v: str(v))
def test_every_model_trains_on_the_flat_vector(name, keys, shape, classes):
    flat = flat_model(name, keys, shape, classes)
    x, y = batch(shape, classes)
    assert flat.module(x).shape == (len(y), classes)
    start = flat.vec.clone()
    trainer = LocalTrainer(flat, ClientConfig(lr=0.05, batch_size=3), x, y)
    trainer.train(torch.arange(len(y)), np.random.default_rng(0), Schedule(3, 2))
    assert flat.check_grads_bound()     # bound again after the steps taken inside backward
    flat.zero_grad()
    nn.functional.cross_entropy(flat.module(x), y).backward()       # into the flat gradient
    assert all(p.grad.abs().sum() > 0 for p in flat.module.parameters()), "a parameter got no gradient"
    moved = (flat.vec[: flat.n_params] != start[: flat.n_params])
    assert moved.float().mean() > 0.5
    # Loading a vector changes what the module computes: parameters are views into it.
    flat.load(start)
    flat.module.eval()
    out_start = flat.module(x)
    flat.load(start * 0)
    assert not torch.allclose(flat.module(x), out_start)


def test_batchnorm_running_statistics_live_in_the_flat_vector():
    flat = flat_model("resnet18", {"norm": "batch"}, (3, 32, 32), 10)
    bn = [m for m in flat.module.modules() if isinstance(m, nn.BatchNorm2d)]
    stats = sum(m.running_mean.numel() + m.running_var.numel() for m in bn)
    assert flat.dim == flat.n_params + stats
    before = flat.vec[flat.n_params:].clone()
    flat.module.train()
    flat.module(batch((3, 32, 32), 10)[0])
    assert not torch.equal(flat.vec[flat.n_params:], before)     # running stats updated inside vec
    bn[0].running_mean.fill_(7.0)
    assert (flat.vec[flat.n_params:] == 7.0).sum() == bn[0].running_mean.numel()


def test_resnet18_group_norm_and_small_image_stem():
    module = build_model(ModelConfig(name="resnet18", norm="group"), (1, 28, 28), 10)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in module.modules())
    gns = [m for m in module.modules() if isinstance(m, nn.GroupNorm)]
    assert gns and all(m.num_groups == 2 for m in gns)
    assert module.conv1.kernel_size == (3, 3) and module.conv1.stride == (1, 1) and module.conv1.in_channels == 1
    assert isinstance(module.maxpool, nn.Identity)
    assert FlatModel(module).dim == FlatModel(module).n_params


def test_simple_cnn_projection_head_convention():
    torch.manual_seed(0)
    module = build_model(ModelConfig(name="simple_cnn", projection=32), (3, 32, 32), 10)
    x, _ = batch((3, 32, 32), 10)
    z, logits = module.forward_rep(x)
    assert z.shape == (6, 32) and logits.shape == (6, 10)
    assert torch.allclose(logits, module.out(z)) and torch.allclose(module(x), logits)
    plain = build_model(ModelConfig(name="simple_cnn"), (3, 32, 32), 10)
    z, logits = plain.forward_rep(x)
    assert z.shape == (6, 84) and torch.allclose(plain(x), logits)
    convs = [m for m in plain.modules() if isinstance(m, nn.Conv2d)]
    linears = [m for m in plain.modules() if isinstance(m, nn.Linear)]
    assert [c.out_channels for c in convs] == [6, 16] and [m.out_features for m in linears] == [120, 84, 10]


def test_cnn2_has_two_conv_and_two_dense_hidden_layers():
    module = build_model(ModelConfig(name="cnn2"), (3, 32, 32), 10)
    assert len([m for m in module.modules() if isinstance(m, nn.Conv2d)]) == 2
    assert len([m for m in module.modules() if isinstance(m, nn.Linear)]) == 3


def test_lstm_is_leafs_shakespeare_model():
    module = build_model(ModelConfig(name="lstm"), (80,), 80)
    assert module.embed.embedding_dim == 8 and module.lstm.hidden_size == 256 and module.lstm.num_layers == 2
    assert module.out.out_features == 80


@pytest.mark.parametrize("name, keys, shape, message", [
    ("lstm", {}, (1, 28, 28), "needs token sequences"),
    ("cnn2", {}, (60,), "needs image data"),
    ("resnet18", {}, (80,), "needs image data"),
    ("simple_cnn", {}, (1, 8, 8), "at least 16x16"),
    ("mlp", {"projection": 16}, (60,), "model.projection = 16"),
])
def test_model_and_data_mismatch_is_a_config_error(name, keys, shape, message):
    with pytest.raises(ConfigError, match=message):
        build_model(ModelConfig(name=name, **keys), shape, 10)
