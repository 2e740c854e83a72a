"""The catalog of registered algorithm classes: `@register` and the declaration checks every class passes when
it is registered or loaded. fedmpi's own algorithms register here on import; `fedmpi.algorithms.registry`
imports them all and looks names up (the catalog imports none of them, so nothing imports back)."""

from __future__ import annotations

import dataclasses

from fedmpi.algorithms.base import BUFFER, GATHER, REDUCE, ROUTE, Algorithm, AlgorithmKeys

REGISTRY: dict = {}


def register(cls):
    """Class decorator: registers `cls` under `cls.name` with its keys dataclass `cls.Keys`."""
    check_declarations(cls)
    default_name = cls.Keys().name
    if default_name != cls.name:
        raise TypeError(f"{cls.__name__}.Keys has name default {default_name!r}, the class is named {cls.name!r}")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise TypeError(f"algorithm name {cls.name!r} is registered twice ({REGISTRY[cls.name].__name__}, "
                        f"{cls.__name__})")
    REGISTRY[cls.name] = cls
    return cls


def check_declarations(cls):
    """The contract a class declares must be self-consistent (a TypeError names what is not); returns the class."""
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
                             or cls.loss_fn is not None or cls.local_training is not None):
        raise TypeError(f"{where} declares vectorizable but has its own protocol, gradient or step hook, or loss, "
                        f"or local_training")
    return cls
