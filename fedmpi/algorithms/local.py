"""Local training only (the lower baseline of personalized FL): every client trains its own model from x_0 and
never communicates; there is no aggregation, so the global model stays x_0.

Each client's whole model lives in its state (`ClientVectors("model")`, on its host, checkpointed); a client
that never trained starts from the broadcast, which is x_0 throughout (the simulator's way of giving every
client the same initial model). Nothing is counted as sent: `wire_dim` is 0, so bytes_up and bytes_down are
0 (`uploads` still counts the clients that trained). Its meaningful figures are the local ones
(`eval.local_every`): `eval_start` loads the client's own model. PFLlib's `Local` is the same: clients
train their own copies and are evaluated on their own test splits.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedmpi.algorithms.base import AlgorithmKeys, Reduce
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.state import ClientVectors


@dataclass(frozen=True)
class LocalKeys(AlgorithmKeys):
    name: str = "local"


@register
class Local(Reduce):
    name = "local"
    Keys = LocalKeys
    keeps_client_state = True
    uses_server_optimizer = False

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.models = ClientVectors("model", length=self.dim)      # each client's own model

    @property
    def wire_dim(self):
        return 0        # nothing travels

    def _own(self, cid, down, model):
        mine = self.models.on(cid, model.device)
        model.load(down[: self.dim] if mine is None else mine)

    def client_start(self, run, down, model):
        self._own(run.cid, down, model)

    def accumulate(self, run, down, model, acc):
        self.models[run.cid] = model.vec.detach().clone()
        return 0.0      # adds nothing to the server's sums

    def aggregate(self, x, up_sum, weight_sum, round_):
        return None

    def eval_start(self, run, down, model):
        self._own(run.cid, down, model)
