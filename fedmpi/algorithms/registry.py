"""Which algorithm a config names: built-in ones (`@register`), installed plug-ins, or `module:Class`.

`algorithm.name` is looked up in this order:
1. the algorithms registered with `@register` (fedmpi's own, and any a user module registered on import);
2. entry points of the group `fedmpi.algorithms` (a package declares
   `[project.entry-points."fedmpi.algorithms"] myalgo = "mypkg.algo:MyAlgo"` and is pip-installed);
3. `package.module:Class`, imported as written (the module must be importable on every rank).
The class found must subclass `fedmpi.algorithms.base.Algorithm` and carry its keys dataclass as `Keys`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from importlib.metadata import entry_points

from fedmpi.algorithms.base import BUFFER, GATHER, REDUCE, ROUTE, Algorithm, AlgorithmKeys
from fedmpi.config_checks import show
from fedmpi.errors import ConfigError

ENTRY_POINT_GROUP = "fedmpi.algorithms"
_REGISTRY: dict = {}


def register(cls):
    """Class decorator: registers `cls` under `cls.name` with its keys dataclass `cls.Keys`."""
    check_declarations(cls)
    default_name = cls.Keys().name
    if default_name != cls.name:
        raise TypeError(f"{cls.__name__}.Keys has name default {default_name!r}, the class is named {cls.name!r}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise TypeError(f"algorithm name {cls.name!r} is registered twice ({_REGISTRY[cls.name].__name__}, "
                        f"{cls.__name__})")
    _REGISTRY[cls.name] = cls
    return cls


def check_declarations(cls):
    """The contract a class declares must be self-consistent (a TypeError names what is not)."""
    where = f"algorithm class {cls.__module__}.{cls.__name__}"
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"{where} is not a subclass of fedmpi.algorithms.base.Algorithm")
    if not cls.name or not isinstance(cls.name, str):
        raise TypeError(f"{where} declares no name")
    if not (dataclasses.is_dataclass(cls.Keys) and issubclass(cls.Keys, AlgorithmKeys)):
        raise TypeError(f"{where}: Keys must be a dataclass subclassing AlgorithmKeys")
    if cls.protocol not in (REDUCE, ROUTE, GATHER, BUFFER):
        raise TypeError(f"{where}: protocol {cls.protocol!r} is none of {REDUCE}, {ROUTE}, {GATHER}, {BUFFER}")
    if cls.__abstractmethods__:
        raise TypeError(f"{where} leaves abstract hooks unimplemented: {', '.join(sorted(cls.__abstractmethods__))}")
    if not isinstance(cls.fixed_cohort_only, str):
        raise TypeError(f"{where}: fixed_cohort_only must be a str, the reason its rounds need the fixed-size draw "
                        f"('' = they do not)")
    if cls.vectorizable and (cls.protocol != REDUCE or cls.grad_hook is not None or cls.step_hook is not None
                             or cls.loss_fn is not None):
        raise TypeError(f"{where} declares vectorizable but has its own protocol, gradient or step hook, or loss")


def builtin_names():
    import fedmpi.algorithms  # noqa: F401 - importing the package registers the built-in algorithms

    return list(_REGISTRY)


def lookup(name):
    """The algorithm class for `algorithm.name`; ConfigError naming what is available otherwise."""
    builtin_names()
    if name in _REGISTRY:
        return _REGISTRY[name]
    plugins = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in plugins:
        return _checked(_load(plugins[name].load, f"entry point {name!r} ({plugins[name].value})"), name)
    if isinstance(name, str) and ":" in name:
        module, _, attr = name.partition(":")
        return _checked(_load(lambda: getattr(importlib.import_module(module), attr), name), name)
    known = list(_REGISTRY) + sorted(plugins)
    close = difflib.get_close_matches(str(name)[:100], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(f"algorithm.name = {show(name)}: unknown{hint}; available: {', '.join(known)}, or "
                      f"'package.module:Class' for an algorithm outside fedmpi")


def _load(get, what):
    try:
        return get()
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"algorithm.name: cannot load {what}: {type(e).__name__}: {e}") from None


def _checked(cls, name):
    try:
        check_declarations(cls)
    except TypeError as e:
        raise ConfigError(f"algorithm.name = {name!r}: {e}") from None
    return cls
