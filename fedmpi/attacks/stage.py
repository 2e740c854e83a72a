"""The model attacks in the round loop: an upload stage that replaces each malicious client's update with
the poisoned one (fedmpi.attacks.model) before anything else on the upload path sees it.

Its place on the upload path is first (`order`, fedmpi.uploads.base): attack, then update compression, then
differential privacy. The attacker is the client: it crafts its update first and then runs the protocol's
client-side code on it like any client, so compression sees (and distorts) the malicious update, and DP's
clipping bounds it as it bounds an honest one (a malicious client that skipped clipping would be no
different from one with a larger clip, which the server cannot tell apart without secure aggregation's
checks). The malicious client keeps its honest weight (its sample count).
"""

from __future__ import annotations

import torch

from fedmpi.attacks import catalog
from fedmpi.attacks import model as attacks_model
from fedmpi.attacks.keys import CLIENT_MODEL_ATTACKS
from fedmpi.core import rng
from fedmpi.uploads.base import ORDER_ATTACK, UploadStage


class AttackStage(UploadStage):
    name, order = "attack", ORDER_ATTACK
    reads = ("attack", "seed")

    @classmethod
    def build(cls, setting, *, attack, seed):
        """The stage where the attack changes uploads and some client is malicious; None otherwise."""
        if not (needs_stage(attack) and len(setting.malicious)):
            return None
        return cls(attack, setting.malicious, seed, setting.dim)

    def __init__(self, attack, malicious, seed, dim):
        self.attack, self.seed, self.dim = attack, seed, dim
        self.malicious = frozenset(int(c) for c in malicious)
        self.plugin = catalog.attack_class(attack.name)(attack) if catalog.is_plugin(attack.name) else None

    def client(self, update, view):
        if update.cid not in self.malicious:
            return update
        update.vector.copy_(update.start + self._poisoned(update.delta(), update.round, update.cid))
        return update

    def _poisoned(self, update, t, cid):
        if self.plugin is None:
            return attacks_model.poisoned_update(self.attack, update, self.seed, t, cid)
        ctx = catalog.AttackContext(t, int(cid), self.attack,
                                    rng.stream(self.seed, rng.ATTACK, t, int(cid), catalog.PLUGIN_DRAW))
        out = self.plugin.poison(update, ctx)
        if not (isinstance(out, torch.Tensor) and out.shape == update.shape):
            raise TypeError(f"attack.name = {self.attack.name!r}: poison() must return a tensor of the update's "
                            f"shape {tuple(update.shape)}, not {type(out).__name__} {tuple(getattr(out, 'shape', ()))}")
        return out.to(update.device, update.dtype)


def needs_stage(attack) -> bool:
    """Whether the attack changes uploads on the client: a model attack (a plug-in's too), or a backdoor
    with a boost."""
    return (attack.name in CLIENT_MODEL_ATTACKS or (attack.name == "backdoor" and attack.scale != 1)
            or (not attack.inert and catalog.is_plugin(attack.name)))
