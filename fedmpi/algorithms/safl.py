"""SAFL, simulated-annealing FL with optional upload gating (papers/003; ALGORITHMS.md "SAFL").

Clients are stateful: client k keeps z_k, its last locally trained model (initially x_0). In round t a
selected client starts from w = u * (eps * zbar + (1 - eps) * z_k) + (1 - u) * zbar, where zbar = x_t is the
latest global model and each element u_j is 1 with probability p_t = exp(-floor(t / q) / L), drawn from
the client's own stream; it trains from w to its new z_k and uploads it. The server forms
zbar_t = sum_k eta_k z_k over the uploaders, eta_k ∝ n_k (`fusion: samples`) or ∝ 1 / ||z_k - zbar_{t-1}||
(`fusion: ida`). eps = 1 or p_t = 0 is FedAvg exactly.

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
from typing import Literal

import numpy as np
import torch

from fedmpi import rng
from fedmpi.algorithms.base import AlgorithmKeys, GatedUploads
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.registry import check_declarations, register
from fedmpi.algorithms.state import ClientVectors
from fedmpi.config_checks import Checks

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

    def __post_init__(self):
        c = Checks("algorithm")
        c.require(self.L > 0, "L", self.L, "must be > 0")
        c.require(self.q >= 1, "q", self.q, "must be a positive integer")
        c.require(0 <= self.eps <= 1, "eps", self.eps, "must be in [0, 1]")
        c.require(self.nu >= 0, "nu", self.nu, "must be >= 0")
        c.require(self.probe_size >= 1, "probe_size", self.probe_size, "must be a positive integer")
        c.done()


@register
class Safl(FedAvg):
    name = "safl"
    Keys = SaflKeys
    vectorizable = False
    keeps_client_state = True

    @classmethod
    def create(cls, cfg, dim, n_params):
        return (GatedSafl if cfg.algorithm.gating else Safl)(cfg, dim, n_params)

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        self.models = ClientVectors("z")   # z_k, on the rank hosting the client
        self.p_t = np.nan

    def setup(self, ctx):
        super().setup(ctx)
        self.x0 = ctx.x0

    def temperature(self, round_):
        return math.exp(-math.floor(round_ / self.keys.q) / self.keys.L)

    # -- client ---------------------------------------------------------------------------------
    def client_start(self, run, down, model):
        zbar = down[: self.dim]
        z = self.models.on(run.cid, zbar.device)
        z = self.x0.to(zbar.device) if z is None else z
        eps, p = self.keys.eps, self.temperature(run.round)
        g = torch.Generator().manual_seed(rng.torch_seed(self.cfg.seed, rng.CLIENT, run.round, run.cid, MASK_KEY))
        u = (torch.rand(self.dim, generator=g) < p).to(zbar.device)
        model.load(torch.where(u, eps * zbar + (1 - eps) * z, zbar))

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

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        self.local_probe = {}              # cid -> held-out indices (probe: local)
        self.probe_idx = None
        self.probe_accuracy = None
        self._global_acc = (None, None)    # (round, h(zbar_{t-1})) cached: the same for every client

    def clients(self, parts, server_idx):
        if self.keys.probe != "local":
            return parts
        kept = []
        for cid, part in enumerate(parts):
            g = rng.stream(self.cfg.seed, rng.DATA, PROBE_KEY, cid)
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
                g = rng.stream(self.cfg.seed, rng.DATA, PROBE_KEY)
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
        draw = rng.stream(self.cfg.seed, rng.CLIENT, run.round, run.cid, UPLOAD_KEY).random()
        uploaded = bool(draw < q)
        run.figures.update(gap=gap, uploaded=float(uploaded))
        return uploaded


check_declarations(GatedSafl)
