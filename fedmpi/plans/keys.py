"""The `participation:` config section: a participation provider from outside fedmpi (docs/how-to/own-algorithm.md,
walk-through 7).

  participation:
    name: mypkg.plans:Cyclic            # an entry point of `fedmpi.participation` or package.module:Class
    keys: {groups: 4}                   # the keys it reads (it declares its `uses`)

fedmpi's own providers are chosen by their keys (server.sampling: poisson, the `clients:` deployment keys,
a BUFFER algorithm); a plug-in provider plans the rounds in their place. At its defaults the section changes
nothing (the standard draw, or the provider those keys choose).
"""

from dataclasses import dataclass, field

from fedmpi.core.config_checks import Checks
from fedmpi.core.plugin_names import well_formed


@dataclass(frozen=True)
class ParticipationConfig:
    name: str | None = None
    """A plug-in provider: an installed entry point of the group `fedmpi.participation`, or 'package.module:Class';
    null: fedmpi's own (the standard draw, Poisson sampling or the deployment's)."""
    keys: dict = field(default_factory=dict)
    """The provider's keys, by name; a key it does not declare it reads is refused."""

    @property
    def inert(self):
        return self.name is None and not self.keys

    def __post_init__(self):
        c = Checks("participation")
        c.require(self.name is None or (isinstance(self.name, str) and (well_formed(self.name)
                                                                       or self.name.isidentifier())),
                  "name", self.name, "must be a plug-in provider ('package.module:Class' or an installed entry "
                  "point's name), or null")
        for key in self.keys:
            c.require(isinstance(key, str) and key.isidentifier(), "keys", key, "each key must be a name")
        c.require(not self.keys or self.name is not None, "keys", self.keys,
                  "is read by a plug-in provider only; participation.name is null")
        c.done()
