"""How `server.aggregator` finds its rule: fedmpi's own (fedmpi.robust.rules.RULES) or a plug-in from outside
fedmpi, named as algorithms, data sets and models are (fedmpi.core.plugin_names): an entry point of the group
`fedmpi.aggregators` or a path `package.module:Class`, imported on every rank when the run is set up (never
when a stored config is read).

A rule class declares what it is (`check_rule` holds it to that when it is loaded, exit 2 naming the key):
  name                 its name in the run's figures
  passes()             how many sweeps over the chunks `aggregate` makes (every rank iterates the schedule)
  aggregate(...)       the round's update and each client's share (an `Outcome`)
  uses                 the server.robust keys it reads (a key it does not read, set, is refused)
  excludes             a share of zero means left out: the round reports detection figures
  needs_server_update  it is handed the server's own update (the server's set must be configured)
docs/how-to/own-algorithm.md ("Walk-through 3") writes one in a file.
"""

from __future__ import annotations

import dataclasses

from fedmpi.core import plugin_names
from fedmpi.core.config_checks import Checks
from fedmpi.core.errors import ConfigError
from fedmpi.robust.keys import USES, RobustConfig, _refuse_unused
from fedmpi.robust.rules import RULES, Rule

GROUP = "fedmpi.aggregators"
KEY = "server.aggregator"
ROBUST_KEYS = frozenset(f.name for f in dataclasses.fields(RobustConfig))


def rule_class(name):
    """The Rule class `server.aggregator = name` stands for (ConfigError naming the key where a plug-in
    cannot be loaded or breaks the contract it declares)."""
    if name in RULES:
        return RULES[name]
    return check_rule(plugin_names.resolve(name, GROUP, KEY), name)


def build_rule(name, keys) -> Rule:
    return rule_class(name)(keys)


def check_rule(cls, name):
    where = f"{KEY} = {name!r}"
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise ConfigError(f"{where}: {cls!r} is not a subclass of fedmpi.robust.rules.Rule")
    if not isinstance(cls.name, str) or not cls.name:
        raise ConfigError(f"{where}: the class {cls.__name__} declares no name")
    declared = getattr(cls, "uses", ())
    if not (isinstance(declared, tuple) and set(declared) <= ROBUST_KEYS):
        raise ConfigError(f"{where}: {cls.__name__}.uses must be a tuple of server.robust keys "
                          f"({', '.join(sorted(ROBUST_KEYS))}); it is {declared!r}")
    for flag in ("excludes", "needs_server_update"):
        if not isinstance(getattr(cls, flag), bool):
            raise ConfigError(f"{where}: {cls.__name__}.{flag} must be True or False")
    passes = cls(RobustConfig()).passes()
    if not (isinstance(passes, int) and not isinstance(passes, bool) and passes >= 1):
        raise ConfigError(f"{where}: {cls.__name__}.passes() must be a positive integer (it returned {passes!r})")
    return cls


def unused_key_problems(name, keys) -> list:
    """A plug-in rule's unused server.robust keys set away from their defaults (fedmpi's own rules are checked
    with the config, fedmpi.robust.keys; a plug-in's `uses` is known only once it is imported)."""
    if name in USES:
        return []
    c = Checks("server.robust")
    _refuse_unused(c, keys, name, {**USES, name: tuple(rule_class(name).uses)})
    return c.errors
