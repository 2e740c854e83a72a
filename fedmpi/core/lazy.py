"""torch, imported on first use: the modules that the config's checks import (the algorithm classes and their
declarations, fedmpi.run.resolve's whole closure) refer to `torch` through these stand-ins, so that resolving a
config (`--dry-run`, set-up's validation, the fuzz suite) does not pay torch's import (seconds on a cold node)
and a config error is reported before it. The first attribute read imports the real module; every value read
is then kept on the stand-in, so a later read costs what a module attribute does."""

from __future__ import annotations

import importlib
import types


class LazyModule(types.ModuleType):
    """A stand-in for the module `name`, importing it at the first attribute read."""

    def __getattr__(self, attr):
        if attr.startswith("__"):       # introspection (copy, pickle, doctest) must not import the module
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self.__name__), attr)
        setattr(self, attr, value)
        return value


torch = LazyModule("torch")
nn = LazyModule("torch.nn")
F = LazyModule("torch.nn.functional")
