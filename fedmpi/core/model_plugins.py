"""Models from outside fedmpi: `model.name` an entry point of the group `fedmpi.models`, a path
`package.module:Class` (or a factory function), or `torchvision:NAME` for torchvision's classification models
(torchvision.models.get_model). The built-in zoo (fedmpi.core.models.BUILDERS) comes first.

How a plug-in learns the data's shape: it is called with `model.kwargs` as keyword arguments, plus
`input_shape=` (one sample's shape, e.g. (3, 32, 32) or (60,)) and `num_classes=` where its signature names
those parameters and model.kwargs does not set them. torchvision's builders take no input shape; they get
`num_classes=` the data's class count unless model.kwargs sets it. What it returns must be a torch.nn.Module
whose parameters are all floating point, and float32 like its floating buffers; `check_takes` then runs one
training sample through it. Every problem is a ConfigError (exit 2) naming model.name, raised before any file
is written.
"""

from __future__ import annotations

import torch
from torch import nn

from fedmpi.core import plugin_names
from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError

GROUP = "fedmpi.models"
TORCHVISION = "torchvision:"


def build_plugin(model, input_shape, num_classes) -> nn.Module:
    """The plug-in model `model.name` (the `model` section) for samples of `input_shape` and `num_classes`
    classes, checked."""
    name, kwargs = model.name, dict(model.kwargs)
    where = f"model.name = {show(name)}"
    if name.startswith(TORCHVISION) and name not in plugin_names.installed(GROUP):
        factory = _torchvision(name[len(TORCHVISION):], where)
        kwargs.setdefault("num_classes", num_classes)
    else:
        factory = plugin_names.resolve(name, GROUP, "model.name")
        if not callable(factory):
            raise ConfigError(f"{where}: names a {type(factory).__name__}, not a class or factory function "
                              f"returning a torch.nn.Module")
        named = plugin_names.named_parameters(factory)
        for key, value in (("input_shape", tuple(input_shape)), ("num_classes", num_classes)):
            if key in named:
                kwargs.setdefault(key, value)
    try:
        module = factory(**kwargs)
    except (KeyboardInterrupt, ConfigError):
        raise
    except SystemExit as e:
        raise ConfigError(f"{where}: building it called sys.exit({show(e.code)})") from None
    except Exception as e:  # noqa: BLE001 - whatever the constructor raises is the plug-in's problem
        first = (str(e).splitlines() or [""])[0][:300]
        raise ConfigError(f"{where}: building it with model.kwargs {show(model.kwargs)} raised "
                          f"{type(e).__name__}: {first}") from None
    if not isinstance(module, nn.Module):
        raise ConfigError(f"{where}: returned a {type(module).__name__}, not a torch.nn.Module")
    bad = [(n, p.dtype) for n, p in module.named_parameters() if not p.is_floating_point()]
    if bad:
        raise ConfigError(f"{where}: parameter {bad[0][0]!r} has dtype {bad[0][1]}; every parameter must be "
                          f"floating point (SGD and the flat model vector are float)")
    if not any(True for _ in module.parameters()):
        raise ConfigError(f"{where}: the model has no parameters; there is nothing to train")
    _check_float32(module, where)
    return module


def _check_float32(model, where):
    """Refuses floating parameters and buffers other than float32: FlatModel lays them onto one float32 vector
    (what travels and what the server averages), which would silently cast them, and a forward that
    computes in its own dtype (x.double()) would then fail in round 0 instead of here. Refused, not cast, as
    torch itself refuses mixed dtypes: the plug-in's author says which precision it wants."""
    entries = [*model.named_parameters(), *model.named_buffers()]
    other = [(n, t.dtype) for n, t in entries if t.is_floating_point() and t.dtype != torch.float32]
    if other:
        raise ConfigError(f"{where}: {other[0][0]!r} has dtype {other[0][1]}; fedmpi trains float32 models "
                          f"(its flat model vector and what travels are float32): build the model in "
                          f"float32, torch's default (drop .double() / dtype=torch.float64, or return "
                          f"model.float())")


def _torchvision(arch, where):
    """torchvision.models' builder `arch` (get_model's registry of classification models)."""
    try:
        from torchvision import models
    except ImportError:
        raise ConfigError(f"{where}: needs the torchvision package (pip install torchvision)") from None
    available = models.list_models(module=models)
    if arch not in available:
        import difflib

        close = difflib.get_close_matches(arch, available, n=1)
        hint = f" (did you mean 'torchvision:{close[0]}'?)" if close else ""
        raise ConfigError(f"{where}: torchvision has no classification model {arch!r}{hint}; see "
                          f"torchvision.models.list_models(module=torchvision.models)")
    return lambda **kwargs: models.get_model(arch, **kwargs)

