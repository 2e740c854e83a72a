"""Plug-ins that make the originals a counterfactual is held to (tests/test_counterfactual_mpi.py), imported on
every rank from this folder (the steps put it on PYTHONPATH).

- `NullUpload` (an upload stage, last on the path): client `null_client`'s update becomes zero with weight zero,
  a client whose upload counts for nothing in FedAvg's sum while it is selected, trains and keeps its place.
- `WithoutClient` (a participation provider): the standard draw and the algorithm's `select`, then client
  `absent` left out of the clients that train: the round as it is without that client and with nothing else
  changed. The counterfactual `drop` trains the client and discards its update; equal models prove that its
  training leaves no trace in anyone else's.
"""

import numpy as np

from fedmpi.plans.base import Participation, RoundPlan
from fedmpi.uploads.base import UploadStage


class NullUpload(UploadStage):
    name, order, reads, uses = "null_upload", 95, ("uploads",), ("null_client",)

    @classmethod
    def build(cls, setting, *, uploads):
        return cls(int(uploads.keys["null_client"]))

    def __init__(self, cid):
        self.cid = cid

    def client(self, update, view):
        if update.cid != self.cid:
            return update
        update.vector.copy_(update.start)
        return update.replace(weight=0.0)

    def server(self, sums, weight, view):
        return sums, weight, {}


class WithoutClient(Participation):
    reads, uses, protocols = ("seed", "partition", "server", "participation"), ("absent",), ("reduce",)

    @classmethod
    def build(cls, setting, *, seed, partition, server, participation):
        provider = cls(setting.algo, seed=seed, num_clients=partition.clients,
                       clients_per_round=server.clients_per_round)
        provider.absent = int(participation.keys["absent"])
        return provider

    def plan(self, t):
        plan = super().plan(t)
        return RoundPlan(t, plan.standard, plan.selected[np.asarray(plan.selected) != self.absent])
