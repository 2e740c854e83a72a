"""The model zoo. Each builder takes the model config, the input shape and the class count."""

from __future__ import annotations

import math

from torch import nn

from fedmpi.errors import ConfigError


def _lr(cfg, shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), classes))


def _mlp(cfg, shape, classes):
    # McMahan et al.'s "2NN": two hidden layers of `hidden` units with ReLU.
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), cfg.hidden), nn.ReLU(),
                         nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, classes))


def _cnn_mnist(cfg, shape, classes):
    # McMahan et al.'s MNIST CNN: two 5x5 convolutions (32, 64 channels) each with 2x2 max pooling,
    # a dense layer of 512 units, softmax output.
    channels, height, width = _image_shape(shape, "cnn_mnist")
    flat = 64 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, classes))


def _image_shape(shape, model):
    if len(shape) != 3:
        raise ConfigError(f"model.name = {model!r}: needs image data (channels, height, width), "
                          f"but the dataset's inputs have shape {tuple(shape)}; use lr or mlp")
    return shape


BUILDERS = {"lr": _lr, "mlp": _mlp, "cnn_mnist": _cnn_mnist}


def build_model(cfg, input_shape, num_classes) -> nn.Module:
    if cfg.name not in BUILDERS:
        raise ConfigError(f"model.name = {cfg.name!r}: not available in this version; "
                          f"available: {', '.join(BUILDERS)}")
    return BUILDERS[cfg.name](cfg, tuple(input_shape), num_classes)
