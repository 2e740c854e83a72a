"""The `uploads:` config section: upload stages from outside fedmpi (docs/how-to/own-algorithm.md, walk-through 6).

  uploads:
    stages: [mypkg.stages:Sparsify]      # entry points of `fedmpi.upload_stages` or package.module:Class
    keys: {fraction: 0.1}                # the keys the plug-in stages read (each declares its `uses`)

fedmpi's own stages are chosen by their own keys (client.compress, privacy, server.secure_aggregation,
server.aggregator: norm_bound, runtime.wire_dtype, a model attack); a plug-in stage joins them on the upload
path at the place its class declares (`order`). At their defaults the section changes nothing.
"""

from dataclasses import dataclass, field

from fedmpi.core.config_checks import Checks
from fedmpi.core.plugin_names import well_formed


@dataclass(frozen=True)
class UploadsConfig:
    stages: tuple = ()
    """Plug-in upload stages: installed entry points of the group `fedmpi.upload_stages`, or 'package.module:Class'."""
    keys: dict = field(default_factory=dict)
    """The plug-in stages' keys, by name; a key no configured stage declares it reads is refused."""

    @property
    def inert(self):
        return not self.stages and not self.keys

    def __post_init__(self):
        if isinstance(self.stages, list):
            object.__setattr__(self, "stages", tuple(self.stages))
        c = Checks("uploads")
        for name in self.stages:
            c.require(isinstance(name, str) and (well_formed(name) or name.isidentifier()), "stages", name,
                      "each must be a plug-in stage: 'package.module:Class' or an installed entry point's name")
        names = [name for name in self.stages if isinstance(name, str)]     # the others are refused above
        c.require(len(set(names)) == len(names), "stages", list(self.stages), "names a stage twice")
        for key in self.keys:
            c.require(isinstance(key, str) and key.isidentifier(), "keys", key, "each key must be a name")
        c.require(not self.keys or self.stages, "keys", self.keys, "is read by plug-in stages only; none is set")
        c.done()
