"""SAFL, simulated-annealing FL with optional upload gating (Nguyen, Kim, Shim, "Gradual Federated Learning with
Simulated Annealing"; docs/explanation/algorithms.md "SAFL").

Clients are stateful: client k keeps z_k, its last locally trained model (initially x_0). In round t a
selected client starts from w = u * (eps * zbar + (1 - eps) * z_k) + (1 - u) * zbar, where zbar = x_t is the
latest global model and each element u_j is 1 with probability p_t = exp(-floor(t / q) / L), drawn from
the client's own stream; it trains from w to its new z_k and uploads it. The server forms
zbar_t = sum_k eta_k z_k over the uploaders, eta_k ∝ n_k (`fusion: samples`) or ∝ 1 / ||z_k - zbar_{t-1}||
(`fusion: ida`). eps = 1 or p_t = 0 is FedAvg exactly.

When the mix happens (`mix`):
  on_selection  as above: when the client is next selected, with the latest global model x_t (default;
                eps = 1 is FedAvg at any participation)
  end_of_round  the paper's order (eq. 5-7): a client that trained in round t mixes its z_k with that
                round's average x_{t+1} = zbar_t, with p_{t+1} and u drawn from (seed, CLIENT, t + 1, k), and
                trains from the mixed w_k when next selected, however many rounds later. The hosting rank
                does the mix at the start of round t + 1, when x_{t+1} arrives in the broadcast (the
                `round_start` hook), so nothing more travels and the result does not depend on -n. A client
                that has never trained starts from x_t (the model it receives when it first joins).
At full participation both give the same numbers; under partial participation end_of_round restarts a
client from the model of the round after it last trained, so eps = 1 is then not FedAvg.

Upload gating (`gating: true`, §IV; the `GatedUploads` protocol): after training, the client measures the
accuracy h of zbar_{t-1} and of z_k on a probe set (`probe: server`: the first `probe_size` samples of the
server's set, or an IID draw of that size from the training set when the server has none; `probe: local`:
a held-out tenth of the client's own data, at least one sample, removed from its training data), computes
the gap Delta_k = (h(zbar_{t-1}) - h(z_k)) / (h(z_k) + 1e-6) and uploads with probability
min(1, exp(-nu Delta_k)). Only uploaders' vectors travel (the round loop's masked gather); nobody uploading
keeps the global model.
"""

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys, GatedUploads
from fedmpi.algorithms.catalog import check_declarations, register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.state import ClientVectors
from fedmpi.core import rng
from fedmpi.core.config_checks import Range, count, factor
from fedmpi.core.lazy import torch

PROBE_KEY, MASK_KEY, UPLOAD_KEY = 11, 12, 13   # distinguish SAFL's streams from the batch stream
LOCAL_PROBE_FRACTION = 0.1


@dataclass(frozen=True)
class SaflKeys(AlgorithmKeys):
    name: str = "safl"
    L: float = 10.0
    """Maximum temperature L in p_t = exp(-floor(t / q) / L)."""
    q: int = 1
    """Rounds per temperature step."""
    eps: float = 0.5
    """Mixing weight of the global model in the client's start point; 1 = FedAvg."""
    gating: bool = False
    """Extended SAFL: clients upload with probability min(1, exp(-nu * gap))."""
    nu: float = 1.0
    """Gating sharpness; 0 = everybody uploads."""
    probe: Literal["server", "local"] = "server"
    """Probe set of the gap: the server's set (or an IID draw) sent to all, or a held-out tenth of each client."""
    probe_size: int = 200
    """Samples of the server probe set."""
    fusion: Literal["samples", "ida"] = "samples"
    """Server weights: by sample count, or inverse distance to the previous global model (IDA)."""
    mix: Literal["on_selection", "end_of_round"] = "on_selection"
    """When a client mixes z_k with the global model: at its next selection with the latest x_t, or at the
    end of the round it trained in with that round's average (the paper's order)."""

    RANGES: ClassVar[dict] = {"L": factor(low_open=True), "q": count(), "eps": Range(0, 1), "nu": factor(),
                              "probe_size": Range(1, 2 ** 31 - 1)}


@register
class Safl(FedAvg):
    name = "safl"
    robust_aggregation = False   # its own aggregate or upload: not a weighted mean of one vector
    uploads_model_delta = False  # its accumulate uploads more than the model's change
    Keys = SaflKeys
    vectorizable = False
    keeps_client_state = True

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        if keys.gating:
            return ["the upload decision depends on the client's own data (its probe-accuracy gap), so "
                    "participation is not the data-independent sampling the accountant assumes"]
        if keys.fusion == "ida":
            return ["IDA fusion weights each upload by 1 / ||z_k - zbar||, a data-dependent weight the clip does "
                    "not bound"]
        return []

    @classmethod
    def form(cls, keys):
        return GatedSafl if keys.gating else Safl

    def __init__(self, keys, context):
        super().__init__(keys, context)
        # z_k, on the rank hosting the client (end_of_round: only until it is mixed at the next round start)
        self.models = ClientVectors("z", length=self.dim)
        # end_of_round: the mixed start point w_k of the next selection
        self.starts = ClientVectors("w", length=self.dim)
        self.p_t = np.nan
        if self.keys.mix == "end_of_round":
            self.round_start = self._mix_last_round

    def setup(self, ctx):
        super().setup(ctx)
        self.x0 = ctx.x0

    def temperature(self, round_):
        return math.exp(-math.floor(round_ / self.keys.q) / self.keys.L)

    # -- client ---------------------------------------------------------------------------------
    def mixed(self, zbar, z, round_, cid):
        """w = u * (eps * zbar + (1 - eps) * z) + (1 - u) * zbar, u_j ~ Bernoulli(p_round) from the client's
        stream (seed, CLIENT, round, cid, MASK_KEY)."""
        eps, p = self.keys.eps, self.temperature(round_)
        g = torch.Generator().manual_seed(rng.torch_seed(self.context.seed, rng.CLIENT, round_, cid, MASK_KEY))
        u = (torch.rand(self.dim, generator=g) < p).to(zbar.device)
        return torch.where(u, eps * zbar + (1 - eps) * z, zbar)

    def client_start(self, run, down, model):
        zbar = down[: self.dim]
        if self.keys.mix == "end_of_round":
            w = self.starts.on(run.cid, zbar.device)
            model.load(zbar if w is None else w)
            return
        z = self.models.on(run.cid, zbar.device)
        z = self.x0.to(zbar.device) if z is None else z
        model.load(self.mixed(zbar, z, run.round, run.cid))

    def _mix_last_round(self, round_, down):
        """end_of_round, at the start of round t on a hosting rank: every z_k trained here in round t - 1
        mixes with x_t (this broadcast), the average of that round, and becomes the client's start point."""
        zbar = down[: self.dim]
        for cid in sorted(self.models):
            self.starts[cid] = self.mixed(zbar, self.models.on(cid, zbar.device), round_, cid)
            del self.models[cid]

    def accumulate(self, run, down, model, acc):
        zbar = down[: self.dim]
        z = self.models[run.cid] = model.vec.clone()
        w = self.fusion_weight(run.weight, z, zbar)    # run.weight: n_k, or 1 under DP's uniform weights
        acc[: self.dim].add_(z - zbar, alpha=w)
        return w

    def fusion_weight(self, n_samples, z, x):
        """eta_k before normalisation: n_k, or 1 / ||z_k - zbar_{t-1}|| for IDA."""
        if self.keys.fusion == "ida":
            return 1.0 / max(float(torch.linalg.vector_norm(z - x)), 1e-12)
        return float(n_samples)

    # -- server ---------------------------------------------------------------------------------
    def aggregate(self, x, up_sum, weight_sum, round_):
        self.p_t = self.temperature(round_)
        return super().aggregate(x, up_sum, weight_sum, round_)

    def round_metrics(self):
        return {"p_t": self.p_t}


class GatedSafl(GatedUploads, Safl):
    """SAFL with upload gating: the gap on a probe set decides whether a client uploads."""

    client_columns = ("gap", "uploaded")
    fusion_weight = Safl.fusion_weight     # SAFL's own rule; GatedUploads, earlier in the MRO, only declares it

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.local_probe = {}              # cid -> held-out indices (probe: local)
        self.probe_idx = None
        self.probe_accuracy = None
        self._global_acc = (None, None)    # (round, h(zbar_{t-1})) cached: the same for every client

    def clients(self, parts, server_idx):
        if self.keys.probe != "local":
            return parts
        kept = []
        for cid, part in enumerate(parts):
            g = rng.stream(self.context.seed, rng.DATA, PROBE_KEY, cid)
            held = max(1, int(len(part) * LOCAL_PROBE_FRACTION)) if len(part) > 1 else 0
            order = g.permutation(part)
            self.local_probe[cid] = np.sort(order[:held])
            kept.append(np.sort(order[held:]))
        return kept

    def setup(self, ctx):
        super().setup(ctx)
        self.probe_accuracy = ctx.probe
        if self.keys.probe == "server":
            if len(self.server_idx):
                self.probe_idx = self.server_idx[: self.keys.probe_size]
            else:
                total = int(np.sum(ctx.sizes))
                g = rng.stream(self.context.seed, rng.DATA, PROBE_KEY)
                self.probe_idx = np.sort(g.choice(total, size=min(self.keys.probe_size, total), replace=False))

    def gate(self, run, down, model):
        """Stores z_k, records the gap and decides (from the client's stream) whether to upload."""
        zbar = down[: self.dim]
        z = self.models[run.cid] = model.vec.clone()
        probe = self.local_probe[run.cid] if self.keys.probe == "local" else self.probe_idx
        if self.keys.probe == "local" or self._global_acc[0] != run.round:
            self._global_acc = (run.round, self.probe_accuracy(zbar, probe))
        h_global, h_local = self._global_acc[1], self.probe_accuracy(z, probe)
        gap = (h_global - h_local) / (h_local + 1e-6)
        q = min(1.0, math.exp(-self.keys.nu * gap))
        draw = rng.stream(self.context.seed, rng.CLIENT, run.round, run.cid, UPLOAD_KEY).random()
        uploaded = bool(draw < q)
        run.figures.update(gap=gap, uploaded=float(uploaded))
        return uploaded


check_declarations(GatedSafl)
