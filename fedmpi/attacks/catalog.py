"""Model attacks from outside fedmpi: `attack.name` names an entry point of the group
`fedmpi.attacks` or a path `package.module:Class`, imported on every rank when the run is set up (never when
a stored config is read), as algorithms, aggregators, data sets and models are (fedmpi.core.plugin_names).

A plug-in attack is a client-side model attack: each malicious client trains honestly, and what it uploads
is `poison(update, ctx)` of its update Delta = y_i - x_t, before compression, privacy and the rest of the
upload path see it (fedmpi.attacks.stage), with the malicious set, `attack.fraction` and `attack.clients`
as for fedmpi's own attacks. It declares (`check_attack` holds it to that, exit 2 naming attack.name):
  name    its name (str)
  uses    the attack keys it reads besides fraction and clients (e.g. ("scale",)); another one set is refused
  poison  (update: float32 torch tensor, ctx: AttackContext) -> the tensor to upload, same shape
Its randomness comes from ctx.rng, the client's own stream (seed, ATTACK, round, client, PLUGIN_DRAW), so the
same client uploads the same vector at every -n and after a resume. docs/how-to/own-algorithm.md, walk-through 4.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedmpi.attacks.keys import ATTACKS, USES, AttackConfig
from fedmpi.core import plugin_names
from fedmpi.core.config_checks import Checks, refuse_unused
from fedmpi.core.errors import ConfigError

GROUP = "fedmpi.attacks"
KEY = "attack.name"
PLUGIN_DRAW = 2         # the key after (seed, ATTACK, round, client) of a plug-in attack's stream
WHO = ("fraction", "clients")
ATTACK_KEYS = frozenset(f.name for f in dataclasses.fields(AttackConfig)) - {"name"}


@dataclass(frozen=True)
class AttackContext:
    round: int
    client: int
    keys: AttackConfig              # the attack section (its `uses` keys among them)
    rng: np.random.Generator        # the client's own stream for this round


class ModelAttack:
    """The base of a plug-in model attack (module docstring)."""

    name = ""
    uses: tuple = ()

    def __init__(self, keys):
        self.keys = keys

    def poison(self, update, ctx):
        raise NotImplementedError


def is_plugin(name) -> bool:
    return name not in ATTACKS


def attack_class(name):
    """The ModelAttack class `attack.name = name` stands for (ConfigError naming the key otherwise)."""
    cls = plugin_names.load_subclass(name, GROUP, KEY, ModelAttack)
    where = f"{KEY} = {name!r}"
    if not isinstance(cls.name, str) or not cls.name:
        raise ConfigError(f"{where}: the class {cls.__name__} declares no name")
    if not (isinstance(cls.uses, tuple) and set(cls.uses) <= ATTACK_KEYS - set(WHO)):
        raise ConfigError(f"{where}: {cls.__name__}.uses must be a tuple of attack keys "
                          f"({', '.join(sorted(ATTACK_KEYS - set(WHO)))}); it is {cls.uses!r}")
    if cls.poison is ModelAttack.poison:
        raise ConfigError(f"{where}: {cls.__name__} does not define poison(update, ctx)")
    return cls


def plugin_problems(attack) -> list:
    """A plug-in attack's keys it does not read, set away from their defaults (loading it first)."""
    c = Checks("attack")
    refuse_unused(c, attack, "name", {**USES, attack.name: WHO + tuple(attack_class(attack.name).uses)}, "attack")
    return c.errors
