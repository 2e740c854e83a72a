"""Participation providers from outside fedmpi: `participation.name` names an entry point of the
group `fedmpi.participation` or a path `package.module:Class`, imported on every rank when the run is set up
(never when a stored config is read), as the other plug-ins are (fedmpi.core.plugin_names).

A plug-in provider is a Participation subclass (fedmpi.plans.base): `plan(t) -> RoundPlan`, a pure function of
the seed, the round and the state it saves (`state`/`load_state`), the same on every rank. It declares, and
`provider_class` holds it to that when it is loaded (exit 2 naming participation.name):
  reads                      the config sections (or top-level values: seed, rounds) its `build` takes
  uses                       the `participation.keys` it reads (another one set is refused)
  RANGES, INTEGERS           optional: {key: Range} and the keys that must be integers, checked at set-up
                             (fedmpi.core.plugin_names.key_problems)
  build(setting, **sections) the provider (a classmethod)
  protocols                  the algorithm families it plans for (default ("reduce",))
  works_with_dp              its plans may be accounted by privacy's accountant (fixed-size sampling of
                             server.clients_per_round of partition.clients each round)
It plans in place of fedmpi's own providers, so it is refused beside server.sampling: poisson and beside the
deployment's keys (`clients:`, server.deadline, server.over_select). docs/how-to/own-algorithm.md, walk-through 7.
"""

from __future__ import annotations

from fedmpi.core import plugin_names
from fedmpi.core.errors import ConfigError
from fedmpi.plans.base import Participation

GROUP = "fedmpi.participation"
KEY = "participation.name"
PROTOCOLS = ("reduce", "gather", "route", "buffer")


def provider_class(name, sections):
    """The Participation class `name` stands for, checked against what it declares; `sections`: the names a
    provider may read (the config's top-level fields)."""
    cls = plugin_names.load_subclass(name, GROUP, KEY, Participation)
    where = f"{KEY} = {name!r}"
    plugin_names.check_names(cls, "reads", where, sections, f"config sections ({', '.join(sections)})")
    plugin_names.check_names(cls, "uses", where)
    plugin_names.check_names(cls, "protocols", where, PROTOCOLS, f"protocols ({', '.join(PROTOCOLS)})")
    if not isinstance(getattr(cls, "works_with_dp", False), bool):
        raise ConfigError(f"{where}: {cls.__name__}.works_with_dp must be True or False")
    if "build" not in vars(cls):
        raise ConfigError(f"{where}: {cls.__name__} does not define build(setting, **sections)")
    if cls.plan is Participation.plan and cls.standard is Participation.standard:
        raise ConfigError(f"{where}: {cls.__name__} defines neither plan(t) nor standard(t)")
    return cls


def problems(participation, sections, *, protocol, privacy, sampling, deployment) -> list:
    """Why the plug-in provider of `participation` (the section) cannot run (one line each; empty when it
    can): one that cannot be loaded or breaks its declarations, a key it does not read, an algorithm family
    (`protocol`) it does not plan for, differential privacy (`privacy`, the section) where it does not declare
    works_with_dp, and fedmpi's own providers asked for beside it (`sampling`: server.sampling; `deployment`:
    whether a deployment key is set)."""
    name = participation.name
    if name is None:
        return []
    try:
        cls = provider_class(name, sections)
    except ConfigError as e:
        return list(e.messages)
    where, found = f"{KEY} = {name!r}", []
    for key in participation.keys:
        if key not in cls.uses:
            found.append(f"participation.keys.{key} = {participation.keys[key]!r}: is not read by {name} (it "
                         f"reads: {', '.join(cls.uses) or 'no key'})")
    found += plugin_names.key_problems(cls, {k: v for k, v in participation.keys.items() if k in cls.uses},
                                       "participation.keys")
    if protocol not in cls.protocols:
        found.append(f"{where} plans for the {', '.join(cls.protocols)} protocol(s); this algorithm uploads by "
                     f"{protocol!r}")
    if privacy.enabled and not cls.works_with_dp:
        found.append(f"{where} does not declare works_with_dp: privacy's accountant cannot bound its cohorts "
                     f"(set privacy.mechanism: none)")
    if sampling != "fixed":
        found.append(f"{where} plans the rounds itself: server.sampling = {sampling!r} asks for another provider "
                     f"(set server.sampling: fixed)")
    if deployment:
        found.append(f"{where} plans the rounds itself: the deployment's keys (clients:, server.deadline, "
                     f"server.over_select, client.compress) ask for the deployment's provider")
    return found
