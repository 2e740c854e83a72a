"""The model zoo. Each builder takes the `model` section, the input shape and the class count (both from the
data set) and returns an nn.Module that FlatModel can lay onto one flat vector.

Convention for contrastive methods (MOON): a module with `forward_rep(x)` returns `(z, logits)`, where
`z` is the representation (the projection head's output when `model.projection` is set) and the logits
are computed from `z`; `forward(x)` returns the logits only.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from fedmpi.core.errors import ConfigError


def _lr(model, shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), classes))


def _mlp(model, shape, classes):
    # McMahan et al.'s "2NN": two hidden layers of `hidden` units with ReLU; `mlp_norm: batch` puts a
    # BatchNorm1d after each hidden layer (a small model with normalization layers, for FedBN).
    if getattr(model, "mlp_norm", "none") == "batch":
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), model.hidden), nn.BatchNorm1d(model.hidden),
                             nn.ReLU(), nn.Linear(model.hidden, model.hidden), nn.BatchNorm1d(model.hidden), nn.ReLU(),
                             nn.Linear(model.hidden, classes))
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), model.hidden), nn.ReLU(),
                         nn.Linear(model.hidden, model.hidden), nn.ReLU(), nn.Linear(model.hidden, classes))


def _cnn_mnist(model, shape, classes):
    # McMahan et al.'s MNIST CNN: two 5x5 convolutions (32, 64 channels) each with 2x2 max pooling,
    # a dense layer of 512 units, softmax output.
    channels, height, width = _image_shape(shape, "cnn_mnist")
    flat = 64 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, classes))


def _cnn2(model, shape, classes):
    # The FSL paper's network: two convolutional and two dense hidden layers. The paper's appendix with the
    # exact sizes is not available here; this is the shape of McMahan et al.'s CIFAR model (TensorFlow's
    # CIFAR-10 tutorial, which that paper and Zhao et al. use): 5x5 convolutions of 64 channels with 2x2 max
    # pooling, dense layers of 384 and 192 units.
    channels, height, width = _image_shape(shape, "cnn2")
    flat = 64 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(), nn.Linear(192, classes))


class SimpleCNN(nn.Module):
    """NIID-Bench's / FedSkip's LeNet-style "simple-cnn": conv 6 (5x5) - pool - conv 16 (5x5) - pool - fc 120
    - fc 84 - out. With `projection` set, MOON's head (ModelFedCon): fc 84 - ReLU - fc `projection` gives z,
    and the output layer reads z. Without it, z is the 84-unit feature vector."""

    def __init__(self, shape, classes, projection=None):
        super().__init__()
        channels, height, width = shape
        side = lambda n: ((n - 4) // 2 - 4) // 2    # noqa: E731 - two 5x5 valid convolutions, each pooled
        flat = 16 * side(height) * side(width)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.head = (nn.Sequential(nn.Linear(84, 84), nn.ReLU(), nn.Linear(84, projection))
                     if projection else nn.Identity())
        self.out = nn.Linear(projection or 84, classes)

    def forward_rep(self, x):
        z = self.head(self.features(x))
        return z, self.out(z)

    def forward(self, x):
        return self.forward_rep(x)[1]


def _simple_cnn(model, shape, classes):
    _, height, width = _image_shape(shape, "simple_cnn")
    if min(height, width) < 16:
        raise ConfigError(f"model.name = 'simple_cnn': needs images of at least 16x16, got {height}x{width}")
    return SimpleCNN(shape, classes, model.projection)


def _pfl_cnn(model, shape, classes):
    # pfl-research's `simple_cnn` (benchmarks/model/pytorch/cnn.py, its CIFAR-10 benchmark model): 3x3 valid
    # convolutions of 32 and 64 channels with ReLU, 2x2 max pooling, dropout 0.25, a dense layer of 128 with
    # ReLU, dropout 0.5, the output layer; 1,626,442 parameters on 3x32x32. pfl takes NHWC images and
    # transposes them; fedmpi's are NCHW already, so the flatten order is the same. Weights Glorot-uniform
    # (pfl matches its TF2 model), biases PyTorch's default, drawn in the same order as pfl.
    channels, height, width = _image_shape(shape, "pfl_cnn")
    if min(height, width) < 6:
        raise ConfigError(f"model.name = 'pfl_cnn': needs images of at least 6x6, got {height}x{width}")
    flat = 64 * ((height - 4) // 2) * ((width - 4) // 2)
    net = nn.Sequential(
        nn.Conv2d(channels, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25), nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, classes))
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    return net


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: embedding of 8, two LSTM layers of 256, a linear layer to the vocabulary,
    predicting the next character from the last step's output."""

    def __init__(self, vocab, embed=8, hidden=256, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        # Shakespeare's ids are uint8 in memory (fedmpi.data.leaf) and the embedding takes int64; other dtypes go
        # in as they are, so that float inputs still fail (a model that cannot take the data is refused).
        if tokens.dtype == torch.uint8:
            tokens = tokens.long()
        states, _ = self.lstm(self.embed(tokens))
        return self.out(states[:, -1])


def _lstm(model, shape, classes):
    if len(shape) != 1:
        raise ConfigError(f"model.name = 'lstm': needs token sequences (data.name: shakespeare), but the "
                          f"dataset's inputs have shape {tuple(shape)}")
    # Next-character prediction: the classes are the vocabulary.
    return CharLSTM(classes)


class ResNetRep(nn.Module):
    """A ResNet body with MOON's projection head (MOON's ModelFedCon for its ResNet-50): the 512 pooled
    features - fc 512 - ReLU - fc `projection` give z, and the output layer reads z."""

    def __init__(self, body, features, projection, classes):
        super().__init__()
        body.fc = nn.Identity()
        self.body = body
        self.head = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.Linear(features, projection))
        self.out = nn.Linear(projection, classes)

    def forward_rep(self, x):
        z = self.head(self.body(x))
        return z, self.out(z)

    def forward(self, x):
        return self.forward_rep(x)[1]


def _resnet18(model, shape, classes):
    # torchvision's ResNet-18 adapted to small images as usual for CIFAR: a 3x3 stride-1 stem and no max
    # pooling. GroupNorm (2 groups) is the default because BatchNorm statistics average badly across
    # non-IID clients (Hsieh et al. 2020); with `norm: batch` the running statistics travel in the flat vector.
    # With `projection` set, MOON's projection head sits between the pooled features and the output layer.
    from torchvision.models import resnet18

    channels, _, _ = _image_shape(shape, "resnet18")
    norm = (lambda c: nn.GroupNorm(2, c)) if model.norm == "group" else nn.BatchNorm2d
    net = resnet18(num_classes=classes, norm_layer=norm)
    net.conv1 = nn.Conv2d(channels, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    if model.projection:
        return ResNetRep(net, net.fc.in_features, model.projection, classes)
    return net


def _causal_lm(model, shape, classes, lora=None):
    # A Hugging Face causal language model with LoRA adapters (fedmpi.core.causal_lm); the lora section is
    # the config's own top-level one.
    from fedmpi.core.causal_lm import build
    from fedmpi.core.lora_keys import LoraConfig

    return build(model, lora if lora is not None else LoraConfig(), shape, classes)


def _image_shape(shape, model):
    if len(shape) != 3:
        raise ConfigError(f"model.name = {model!r}: needs image data (channels, height, width), "
                          f"but the dataset's inputs have shape {tuple(shape)}; use lr or mlp")
    return shape


# Zoo models that train with fedmpi.core.cpu_kernels' fast paths under `runtime.kernels: auto` on the CPU:
# plain Sequentials of convolutions, pooling, ReLU and layers the hooks cover.
FAST_CPU_KERNELS = frozenset({"cnn_mnist", "cnn2", "pfl_cnn"})

BUILDERS = {"lr": _lr, "mlp": _mlp, "cnn_mnist": _cnn_mnist, "cnn2": _cnn2, "simple_cnn": _simple_cnn,
            "lstm": _lstm, "resnet18": _resnet18, "pfl_cnn": _pfl_cnn, "causal_lm": _causal_lm}


def build_model(model, input_shape, num_classes, lora=None) -> nn.Module:
    """The module of the `model` section for inputs of `input_shape` and `num_classes` classes; `lora` is the
    config's `lora` section (read by causal_lm only; None: its defaults)."""
    if model.projection is not None and model.name not in BUILDERS:
        raise ConfigError(f"model.projection = {model.projection}: only simple_cnn and resnet18 have a projection "
                          f"head; set it null for model.name = {model.name!r}")
    if model.name not in BUILDERS:        # a model from outside fedmpi (a plug-in or torchvision:NAME)
        from fedmpi.core.model_plugins import build_plugin

        return build_plugin(model, tuple(input_shape), num_classes)
    if model.projection is not None and model.name not in ("simple_cnn", "resnet18"):
        raise ConfigError(f"model.projection = {model.projection}: only simple_cnn and resnet18 have a projection "
                          f"head; set it null for model.name = {model.name!r}")
    if model.name == "causal_lm":
        return _causal_lm(model, tuple(input_shape), num_classes, lora)
    return BUILDERS[model.name](model, tuple(input_shape), num_classes)


def check_takes(model, model_name, data_name, x_train, num_classes):
    """ConfigError (exit 2) unless the model built for `model.name` (`model_name`) takes the inputs of
    `data.name` (`data_name`): one training sample through a forward pass must give [1, num_classes] outputs.
    Run at set-up, before any file is written, so that a model that cannot take the data (an lstm on images
    or on synthetic features) is refused there and never fails in round 0 after --overwrite replaced the old
    run. In eval mode and without gradients, so nothing of the model (BatchNorm's running statistics) and no
    random stream moves."""
    if len(x_train) == 0:
        return
    sample = torch.from_numpy(np.array(x_train[:1]))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(sample)
    except Exception as e:  # noqa: BLE001 - whatever the forward raises, the pair is what is wrong
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"model.name = {model_name!r} cannot take data.name = {data_name!r}'s inputs "
                          f"(one sample of shape {tuple(sample.shape[1:])}, dtype {sample.dtype}): {reason}; "
                          f"choose a model for this data (lstm and causal_lm take shakespeare's token sequences; "
                          f"lr, mlp and the CNNs float features or images)") from None
    finally:
        model.train(was_training)
    if tuple(getattr(out, "shape", ())) != (1, num_classes):
        raise ConfigError(f"model.name = {model_name!r} on data.name = {data_name!r}: one sample gives "
                          f"outputs of shape {tuple(getattr(out, 'shape', ()))}, not (1, {num_classes}) for "
                          f"its {num_classes} classes")
