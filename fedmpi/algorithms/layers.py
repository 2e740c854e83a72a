"""Which layers of a model a personalized algorithm keeps personal: the model's last linear layer (FedPer's
head, LG-FedAvg's shared head) and its normalization layers (FedBN), as fnmatch patterns over the names of
the flat model's entries (`FlatModel.entries`, the names of named_parameters() and named_buffers()).

`model` is a FlatModel or its ModelShape (fedmpi.core.model_shape): both name their entries, their linear
layers (`linear_layers`) and their normalization layers (`norm_layers`), so these rules are pure and the
resolve step asks them before any model exists on a rank."""

from __future__ import annotations

from fedmpi.core.config_checks import Checks
from fedmpi.core.errors import ConfigError


def _under(name, prefix):
    return name.startswith(prefix + ".")


def last_linear(model, key) -> str:
    """The module name of the model's last nn.Linear (in named_modules order). ConfigError naming `key` (the
    algorithm) when it has none."""
    names = model.linear_layers
    if not names:
        raise ConfigError(f"{key} needs a model whose last layer is linear (its head); model has no nn.Linear")
    return names[-1]


def head_patterns(model, key) -> tuple:
    """The patterns of the last linear layer's entries (its weight and bias)."""
    return (last_linear(model, key) + ".*",)


def body_patterns(model, key) -> tuple:
    """The names of every entry outside the last linear layer, or ConfigError naming `key` when there are none
    (a model that is its head alone, such as `lr`)."""
    head = last_linear(model, key)
    body = tuple(name for name, _, _ in model.entries if not _under(name, head))
    if not body:
        raise ConfigError(f"{key} needs layers before the model's last linear layer (a body to keep personal); "
                          f"this model is its head alone: use mlp, cnn_mnist, cnn2, simple_cnn or resnet18")
    return body


def norm_patterns(model) -> tuple:
    """The patterns of every normalization layer's entries (parameters and float buffers); () when it has
    none."""
    prefixes = [name for name in model.norm_layers if name]
    return tuple(p + ".*" for p in prefixes if any(_under(n, p) for n, _, _ in model.entries))


def refuse_personal_entries(cfg, why):
    """ConfigError naming model.personal when it is set for an algorithm that loads whole models per client
    (`why`: what the algorithm keeps instead), so that personal entries could not be kept beside them."""
    c = Checks("model")
    c.require(not cfg.model.personal, "personal", list(cfg.model.personal),
              f"{why}; personal entries beside it are not supported: leave model.personal empty")
    c.done()
