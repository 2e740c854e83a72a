"""Upload stages from outside fedmpi: `uploads.stages` names entry points of the group
`fedmpi.upload_stages` or paths `package.module:Class`, imported on every rank when the run is set up (never
when a stored config is read), as aggregators, attacks and server optimizers are (fedmpi.core.plugin_names).

A plug-in stage is an UploadStage subclass (fedmpi.uploads.base: `client(update, view) -> update`, `server(sums,
weight, view) -> (sums, weight, metrics)`, and `header`/`begin` where it talks over the round). It declares
what it is, and `stage_class` holds it to that when it is loaded (exit 2 naming uploads.stages):
  name                           its name (str): its scalars and checkpoint group go under it
  order                          its place on the upload path, an int in [0, 100] (fedmpi's: attack 10,
                                 compression 20, privacy 30, secure aggregation 40, norm bound 50, wire 90)
  reads                          the config sections (or top-level values: seed, rounds) its `build` takes
  uses                           the `uploads.keys` it reads (a key no configured stage uses is refused)
  RANGES, INTEGERS               optional: {key: Range} and the keys that must be integers, checked at set-up
                                 (fedmpi.core.plugin_names.key_problems)
  build(setting, **sections)     the stage (a classmethod; it may return None to leave itself off)
  works_with_dp                  it may run under privacy.mechanism: gaussian (it keeps the clipped bound)
  works_with_secure_aggregation  it may run under server.secure_aggregation (the server sees only the sum)
docs/how-to/own-algorithm.md ("Walk-through 6") writes one in a file.
"""

from __future__ import annotations

import dataclasses

from fedmpi.core import plugin_names
from fedmpi.core.errors import ConfigError
from fedmpi.uploads.base import UploadStage

GROUP = "fedmpi.upload_stages"
KEY = "uploads.stages"
CAPABILITIES = ("works_with_dp", "works_with_secure_aggregation")


def stage_class(name, sections):
    """The UploadStage class `name` stands for, checked against what it declares; `sections`: the names a
    stage may read (the config's top-level fields)."""
    cls = plugin_names.load_subclass(name, GROUP, KEY, UploadStage)
    where = f"{KEY} = {name!r}"
    if not isinstance(cls.name, str) or not cls.name:
        raise ConfigError(f"{where}: the class {cls.__name__} declares no name")
    if not (isinstance(cls.order, int) and not isinstance(cls.order, bool) and 0 <= cls.order <= 100):
        raise ConfigError(f"{where}: {cls.__name__}.order must be an int in [0, 100]; it is {cls.order!r}")
    plugin_names.check_names(cls, "reads", where, sections, f"config sections ({', '.join(sections)})")
    plugin_names.check_names(cls, "uses", where)
    for flag in CAPABILITIES:
        if not isinstance(getattr(cls, flag, False), bool):
            raise ConfigError(f"{where}: {cls.__name__}.{flag} must be True or False")
    if cls.build.__func__ is UploadStage.build.__func__:
        raise ConfigError(f"{where}: {cls.__name__} does not define build(setting, **sections)")
    return cls


def plugin_stages(uploads, sections) -> tuple:
    """The plug-in stage classes `uploads` (the section) names, loaded and checked."""
    return tuple(stage_class(name, sections) for name in uploads.stages)


def problems(uploads, sections, *, protocol, privacy, secure_aggregation) -> list:
    """Why the plug-in stages of `uploads` cannot run (one line each; empty when they can): a class that
    cannot be loaded or breaks its declarations, a key of uploads.keys none of them reads, an algorithm whose
    uploads do not travel by one reduction (`protocol`), differential privacy (`privacy`, the section) or
    secure aggregation (`secure_aggregation`: server.secure_aggregation) where a stage does not declare it
    works with them."""
    if not uploads.stages:
        return []
    try:
        classes = plugin_stages(uploads, sections)
    except ConfigError as e:
        return list(e.messages)
    found = []
    read = {key for cls in classes for key in getattr(cls, "uses", ())}
    for key in uploads.keys:
        if key not in read:
            found.append(f"uploads.keys.{key} = {uploads.keys[key]!r}: is not read by any of uploads.stages "
                         f"({', '.join(uploads.stages)}); they read: {', '.join(sorted(read)) or 'no key'}")
    for cls in classes:
        found += plugin_names.key_problems(cls, {k: v for k, v in uploads.keys.items() if k in cls.uses},
                                           "uploads.keys")
    for name, cls in zip(uploads.stages, classes):
        where = f"uploads.stages: {name!r}"
        if protocol != "reduce":
            found.append(f"{where}: upload stages apply to uploads summed by the reduce protocol; this algorithm "
                         f"uploads by {protocol!r}")
        if privacy.enabled and not cls.works_with_dp:
            found.append(f"{where} does not declare works_with_dp: it cannot run under privacy.mechanism = "
                         f"{privacy.mechanism!r} (set privacy.mechanism: none)")
        if secure_aggregation != "none" and not cls.works_with_secure_aggregation:
            found.append(f"{where} does not declare works_with_secure_aggregation: it cannot run under "
                         f"server.secure_aggregation = {secure_aggregation!r}")
    return found


def section_names(config_cls) -> tuple:
    """The names a component may read: the config's top-level fields."""
    return tuple(f.name for f in dataclasses.fields(config_cls))
