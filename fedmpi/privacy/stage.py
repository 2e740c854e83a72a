"""DP-FedAvg in the round loop: the upload stage of `privacy.mechanism: gaussian` (docs/how-to/privacy.md).

Where each part runs:
  every rank, each round   receives the round's clip C from rank 0's broadcast header (adaptive clipping;
                           a fixed clip is the config's), so every rank clips with the same float32 value
  worker, per client       clips Delta_i = y_i - x_t to C in place (model.vec = x_t + clipped Delta_i),
                           sets the weight to 1 and reports (clipped?, 1) in the round's one reduction
  rank 0, after reduction  adds the (seed, round) noise of std z_Delta * C to the summed vector, moves the
                           adaptive clip from the noised count, and returns the expected cohort size as
                           the weight the algorithm divides by
  rank 0, at set-up        resolves the noise multiplier (target_epsilon calibrates it) and the epsilon
                           curve for /metrics/epsilon; a checkpoint's noise multiplier wins on resume
"""

from __future__ import annotations

import math

import numpy as np

from fedmpi.core.errors import InputError
from fedmpi.privacy import plan
from fedmpi.privacy.accounting import Sampling
from fedmpi.privacy.mechanism import add_noise_, clip_update_
from fedmpi.uploads.base import ORDER_PRIVACY, UploadStage
from fedmpi.uploads.forked import ForkAccounting, parent_value

CLIPPED, COUNT = 0, 1      # the stage's sums in the reduction: updates clipped, updates counted


class PrivacyStage(UploadStage):
    name, order = "privacy", ORDER_PRIVACY
    reads = ("privacy", "server", "partition", "rounds", "seed")
    up_scalars = 2

    # Its conditions (fedmpi.privacy.plan.stage_problems, the accountant's library) are fedmpi.run.resolve's.

    @classmethod
    def build(cls, setting, *, privacy, server, partition, rounds, seed):
        """The stage under `privacy.mechanism: gaussian`; None otherwise."""
        if not privacy.enabled:
            return None
        sampling = Sampling(server.sampling, partition.clients, server.clients_per_round)
        return cls(privacy, sampling, rounds, seed, setting.algo.up_vectors * setting.dim, setting.dim,
                   on_server=setting.on_server)

    def __init__(self, privacy, sampling, rounds, seed, noise_len, dim, on_server=False):
        """`noise_len`: the entries of the summed upload the noise covers (every uploaded vector); rank 0
        (`on_server`) resolves the noise multiplier and the epsilon curve."""
        self.privacy, self.sampling, self.rounds, self.seed, self.dim = privacy, sampling, rounds, seed, dim
        self.noise_len = noise_len
        self.header_size = 1 if privacy.adaptive_clip else 0
        self.plan = self.estimator = self.curve = None     # rank 0
        self.fork = ForkAccounting()
        if on_server:
            self._resolve()
            self.estimator = plan.make_adaptive_clip(privacy, self.plan)

    # -- rank 0 at set-up and on resume -----------------------------------------------------------------
    def _resolve(self, noise_multiplier=None):
        self.plan = plan.resolve(self.privacy, self.sampling, self.rounds, noise_multiplier)
        self.curve = self.plan.epsilon_curve()

    def state(self) -> dict:
        state = {"noise_multiplier": np.array([self.plan.noise_multiplier], dtype=np.float64)}
        if self.estimator is not None:
            state.update(self.estimator.state())
        return state

    def load_state(self, state: dict):
        """A resumed run keeps the noise multiplier its first part used, even when `rounds` (and with it
        target_epsilon's calibration) changed; only the epsilon curve follows the new length."""
        if "noise_multiplier" in state:
            z = np.asarray(state["noise_multiplier"], dtype=np.float64)
            if z.shape != (1,) or not (math.isfinite(z[0]) and z[0] >= 0):
                raise InputError(f"checkpoint stage_privacy/noise_multiplier = {z!r}: expected one finite "
                                 f"number >= 0")
            if float(z[0]) != self.plan.noise_multiplier:
                self._resolve(float(z[0]))
        if self.estimator is not None and "clip" in state:
            self.estimator.load_state(state)

    def forked(self, fork_round, parent_cfg):
        """A fork's parent without client-level DP: the whole model's epsilon is unbounded (uploads/forked.py)."""
        self.fork.forked(fork_round, parent_value(parent_cfg, "privacy.mechanism") == "gaussian")

    def attrs(self) -> dict:
        p = self.plan
        return {"privacy_noise_multiplier": p.noise_multiplier,
                "privacy_update_noise_multiplier": p.update_noise_multiplier,
                **self.fork.attrs("privacy", self.curve, p.epsilon), "privacy_delta": p.delta,
                "privacy_accountant": p.accountant}

    # -- every rank, each round --------------------------------------------------------------------------
    def header(self, t) -> list:
        return [self.estimator.clip]

    def _clip(self, view):
        """This round's C on this rank: rank 0's adaptive clip as every rank received it, or the fixed one."""
        return float(view.header[0]) if self.header_size else float(self.privacy.clip)

    # -- worker, per counted client ----------------------------------------------------------------------
    def client(self, update, view):
        clip = self._clip(view)
        delta = update.delta()
        norm = clip_update_(delta, clip)
        clipped = 0.0 if norm <= clip else 1.0      # a NaN norm counts as clipped (it was zeroed)
        if clipped:
            update.vector.copy_(update.start + delta)
        # DP-FedAvg's uniform weights: n_i would let one client exceed the bound
        return update.adding(weight=1.0, scalars={self.name: (clipped, 1.0)})

    # -- rank 0, after the reduction -------------------------------------------------------------------
    def server(self, sums, weight, view) -> tuple:
        p, t, clip = self.plan, view.plan.round, self._clip(view)
        add_noise_(sums[: self.noise_len], p.update_noise_multiplier * clip, self.seed, t)
        clipped, count = float(view.scalars[CLIPPED]), float(view.scalars[COUNT])
        figures = {"epsilon": self.fork.at(self.curve, t), "dp_clip": clip,
                   "dp_clipped_fraction": clipped / count if count else math.nan}
        if self.estimator is not None:
            # Each client's report b_i - 1/2 is 1/2 unclipped, -1/2 clipped: their sum is count/2 - clipped.
            figures["dp_unclipped_estimate"] = self.estimator.step(count / 2 - clipped, self.seed, t)
        return sums, p.sampling.expected_size, figures


def dry_run_lines(cfg, algo_cls) -> list:
    """`fedmpi run --dry-run`: the noise and the epsilon the configured run will reach (nothing when sampling
    and privacy are off), for a config fedmpi.run.resolve accepted."""
    lines = []
    if cfg.server.sampling == "poisson" and not cfg.privacy.enabled:
        lines.append(f"sampling: Poisson, q = {plan.sampling_of(cfg).rate:.4g}")
    if cfg.privacy.enabled:
        lines.append(plan.resolve(cfg.privacy, plan.sampling_of(cfg), cfg.rounds).describe())
    return lines
