"""Weights & Biases: a run of project `runtime.tracking_project` (default: the run folder's name) with its
files under OUT/wandb (pip install 'fedmpi[wandb]').

Offline unless W&B can be reached: WANDB_MODE, when set, decides (online, offline, disabled); otherwise the
run is online only where an API key is given (WANDB_API_KEY), else offline, so a cluster node without
network writes OUT/wandb/offline-run-* for `wandb sync` later. W&B's console capture is off (fedmpi's own
output stays as it is) and its start waits at most INIT_TIMEOUT_S.

--resume continues the same W&B run (its id is in run.h5's `tracking_wandb`, resume="allow"); W&B's steps only
go forward, so rounds the resumed run recomputes (after the checkpoint, logged before the interruption) keep
their first values there, while run.h5 has the recomputed ones (the same, unless the run is not
deterministic)."""

from __future__ import annotations

import os
import uuid

from fedmpi.run.tracking import Tracker

INIT_TIMEOUT_S = 30


def mode():
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, cfg, out, previous):
        import wandb

        self._wandb = wandb
        # An identity, not a draw that touches results (no seeded stream needed).
        self.identity = previous or uuid.uuid4().hex[:12]
        self.run = wandb.init(project=cfg.runtime.tracking_project or os.path.basename(out), dir=out,
                              name=os.path.basename(out), id=self.identity, resume="allow", mode=mode(),
                              settings=wandb.Settings(console="off", silent=True, init_timeout=INIT_TIMEOUT_S))

    def log_params(self, params):
        self.run.config.update(params, allow_val_change=True)

    def log_round(self, step, scalars, clients, wall_time):
        data = dict(scalars)
        data.update({tag: self._wandb.Histogram(row) for tag, row in clients.items()})
        self.run.log(data, step=step)

    def close(self, status):
        self.run.finish(exit_code=0 if status == "finished" else 1)

    def abandon(self):
        self.run.finish(exit_code=1)
