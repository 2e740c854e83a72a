"""Secure aggregation as the last upload stage (fedmpi.uploads.base): every counted client's update becomes a
masked vector of integers in Z_{2^b} (the update's `encoded` payload); the round's transport
(fedmpi.round.protocols.SecureReduce) sums each rank's masked vectors, one integer reduction
(`Comm.reduce_sum_mod`) sums the ranks', and rank 0 unmasks the total and decodes it where the algorithm's
float sum would be (`decode`). The float reduction carries no update at all: it leaves the model vector out
(`own_vector_transport`), and only the statistics, scalars and per-client figures travel as floats.

Where each part runs:
  every rank, round start   the round's set-up (cohort = the plan's selected clients, graph, public keys)
  worker, per counted client  clip, weight (secagg.weighting), scale, stochastic rounding (its stream),
                            distributed-DP noise, masks; the model becomes x_t + q_i / (scale w_i), weight w_i
  the transport             the rank's sum of the masked vectors, the integer reduction (collective)
  rank 0, after it          the unmasking (Shamir reconstruction, mask removal), decoding, the figures
The upload is averaged with uniform weights by default, as in DP-FedAvg. With `secagg.weighting: samples` each
client multiplies its clipped update by w_i = n_i / n_max, a weight the server knows (every rank has the
partition), before it becomes integers; w_i <= 1, so the field's bound and a client's sensitivity under
distributed DP stay those of the uniform case, and the server divides the decoded sum by the survivors' sum of
w_i (carried by the float reduction as the round's weight).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from fedmpi.core import rng
from fedmpi.secagg import agreement, costs
from fedmpi.secagg.checks import noise_stddev, plan_of, problems, warnings
from fedmpi.secagg.graph import degrees
from fedmpi.secagg.masks import NOISE_SAMPLERS, from_ring, quantize, to_ring
from fedmpi.secagg.protocol import masked_upload, setup, unmask
from fedmpi.uploads.base import ORDER_SECAGG, UploadStage
from fedmpi.uploads.forked import ForkAccounting, parent_value

# The stage's sums in the reduction: the clients' masking seconds, updates clipped, updates zeroed (a non-finite
# update cannot be clipped into the field: it is masked as zeros, and /metrics/secagg_zeroed_updates counts it).
MASK_SECONDS, CLIPPED, ZEROED = 0, 1, 2


class SecAggStage(UploadStage):
    name, order = "secagg", ORDER_SECAGG
    up_scalars = 3
    own_vector_transport = True

    problems = staticmethod(problems)

    def __init__(self, keys, plan, seed, dim, kept_indices=None, curve=None, max_weight=None):
        """`plan`: the protocol's numbers (fedmpi.secagg.checks.plan_for); `kept_indices(round)`: the coordinates
        every client of the round uploads (shared rand-k), None for all; `curve`: the accountant's epsilon per
        round for the distributed noise (rank 0, None without noise). Both come from packages this one does
        not import (deploy's rand-k, privacy's accountant): fedmpi.round.providers builds the stage. `max_weight`:
        n_max of secagg.weighting samples (None: uniform weights)."""
        self.keys, self.mode, self.seed, self.dim = keys, plan.mode, seed, dim
        self.plan = plan
        self.kept_indices, self.curve, self.max_weight = kept_indices, curve, max_weight
        self.length = dim if kept_indices is None else len(kept_indices(0))
        self.masked_bytes = costs.masked_bytes(self.length, self.keys.bits)
        self.bits = keys.bits
        self.setup = self.kept = None       # the round's (`begin`): its key graph and shares, rand-k's coordinates
        self.fork = ForkAccounting()

    def attrs(self) -> dict:
        p = self.plan
        out = {"secagg_mode": p.mode, "secagg_bits": self.keys.bits, "secagg_threshold": p.threshold,
               "secagg_neighbours": p.neighbours, "secagg_min_bits": p.min_bits}
        if self.curve is not None:
            out.update(self.fork.attrs("secagg", self.curve, float(self.curve[-1]) if len(self.curve) else 0.0))
        return out

    def forked(self, fork_round, parent_cfg):
        """A fork's parent without the distributed noise: the model's epsilon is unbounded (uploads/forked.py)."""
        self.fork.forked(fork_round, parent_value(parent_cfg, "server.secure_aggregation", "none") != "none"
                         and parent_value(parent_cfg, "secagg.noise", "none") != "none")

    # -- every rank ------------------------------------------------------------------------------------
    def begin(self, plan, view):
        self.setup = setup(self.mode, plan.selected, self.plan.neighbours, self.plan.threshold, self.keys.bits,
                           self.length, self.seed, plan.round)
        self.kept = None if self.kept_indices is None else self.kept_indices(plan.round)

    def zeros(self):
        """A rank's empty masked sum of the round (what fedmpi.round.protocols.SecureReduce adds the
        `encoded` uploads into, modulo 2^64, before the integer reduction)."""
        return np.zeros(self.length, dtype=np.uint64)

    # -- worker, per counted client ----------------------------------------------------------------------
    def client(self, update, view):
        began = time.perf_counter()
        keys, cid, t = self.keys, update.cid, update.round
        x = update.start
        delta = update.delta().detach().to("cpu", torch.float64).numpy()
        if self.kept is not None:
            delta = delta[self.kept]
        weight = 1.0 if self.max_weight is None else update.run.n_samples / self.max_weight
        q, norm = quantize(delta, keys.clip, keys.scale * weight,
                           rng.stream(self.seed, rng.SECAGG, t, cid, agreement.ROUNDING))
        sent = q
        if keys.noise != "none":
            sigma = noise_stddev(keys) / math.sqrt(len(self.setup.cohort))
            noise = NOISE_SAMPLERS[keys.noise](sigma, self.length,
                                               rng.stream(self.seed, rng.SECAGG, t, cid, agreement.NOISE))
            sent = q + noise
        y, _ = masked_upload(self.setup, cid, to_ring(sent, keys.bits))
        # The trained model as the server's sum holds it (noise aside), per unit weight: x_t + q_i / (scale w_i).
        unit = keys.scale * weight if weight > 0 else keys.scale        # (a client without samples sends 0)
        decoded = np.zeros(self.dim) if self.kept is not None else None
        if decoded is not None:
            decoded[self.kept] = q / unit
        else:
            decoded = q / unit
        update.vector.copy_(x + torch.from_numpy(decoded).to(update.vector.device, update.vector.dtype))
        degree = len(self.setup.graph[cid])
        clipped = 0.0 if norm <= keys.clip else 1.0      # a NaN norm counts as clipped (it was zeroed)
        zeroed = 0.0 if math.isfinite(norm) else 1.0
        return update.adding(weight=weight, bytes=self.masked_bytes + costs.client_cost(degree, 0, True).up,
                             encoded=y, scalars={self.name: (time.perf_counter() - began, clipped, zeroed)})

    # -- rank 0, after the reductions -------------------------------------------------------------------
    def decode(self, plan, total, sums, weight) -> tuple:
        """The combination's last step (fedmpi.round.protocols.SecureReduce): the reduced masked `total`
        unmasked over the round's survivors and decoded into the model's place in `sums` (in place; the
        float reduction left rank 0's own there); (the weight to divide by, 0 where the round fails: no
        update, the model stays as it was; the protocol's figures)."""
        survivors = [int(c) for c in np.asarray(plan.selected)[plan.counts_mask()]]
        result = unmask(self.setup, total, survivors)
        figures = self._costs(survivors, result)
        sums[: self.dim].zero_()
        if result.total is None:
            return 0.0, figures
        decoded = torch.from_numpy(from_ring(result.total, self.keys.bits).astype(np.float64) / self.keys.scale)
        decoded = decoded.to(sums.device, sums.dtype)
        if self.kept is None:
            sums[: self.dim] = decoded
        else:
            sums[torch.from_numpy(self.kept).to(sums.device)] = decoded
        return weight, figures

    def server(self, sums, weight, view) -> tuple:
        """The clients' figures from the stage's reduced scalars, and the distributed noise's epsilon."""
        survivors = int(view.plan.counts_mask().sum())
        mask_s, clipped = float(view.scalars[MASK_SECONDS]), float(view.scalars[CLIPPED])
        figures = {"secagg_client_mask_s": mask_s / survivors if survivors else math.nan,
                   "secagg_clipped_fraction": clipped / survivors if survivors else math.nan,
                   "secagg_zeroed_updates": float(view.scalars[ZEROED])}
        if self.curve is not None:
            figures["epsilon"] = self.fork.at(self.curve, view.plan.round)
        return sums, weight, figures

    def _costs(self, survivors, result) -> dict:
        s, alive = self.setup, set(survivors)
        deg = {u: len(vs) for u, vs in s.graph.items()}
        per = [costs.client_cost(deg[u], len(survivors), u in alive) for u in s.cohort]
        n = max(len(per), 1)
        figures = {
            "secagg_failed": float(result.total is None),
            "secagg_survivors": len(survivors),
            "secagg_dropped": len(s.cohort) - len(survivors),
            "secagg_messages": costs.messages(len(s.cohort), len(survivors)),
            "secagg_masked_bytes": self.masked_bytes,
            "secagg_extra_up_bytes": sum(c.up for c in per) / n,
            "secagg_extra_down_bytes": sum(c.down for c in per) / n,
            "secagg_server_prg": result.expansions,
            "secagg_unmask_s": result.seconds,
            "secagg_client_prg": float(degrees(s.graph).mean() + 1) if s.cohort else 0.0,
        }
        if self.keys.noise != "none":
            # The noise actually in the sum: the survivors' shares only (S' of S).
            frac = len(survivors) / len(s.cohort) if s.cohort else 0.0
            figures["secagg_noise_multiplier"] = self.keys.noise_multiplier * math.sqrt(frac)
        return figures


def dry_run_lines(cfg, algo_cls) -> list:
    """`fedmpi run --dry-run`: secure aggregation's numbers and what is weaker than it should be (nothing when
    it is off), for a config fedmpi.run.resolve accepted."""
    if cfg.server.secure_aggregation == "none":
        return []
    return [plan_of(cfg).describe(), *(f"warning: {w}" for w in warnings(cfg, algo_cls))]
