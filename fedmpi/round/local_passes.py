"""Passes of local SGD for algorithms that train more than one model, or in phases (`Algorithm.local_training`).

Ditto trains the global model and a personal one, FedRep a head then a body, APFL a global and a mixed model,
Per-FedAvg alternates an inner and an outer step: each asks for one or more passes over the client's own
training data. `LocalPasses` is what such a hook receives: `train(...)` runs one pass on the rank's model
from its current vector, `loss()` is the mean training loss of the current vector (IFCA's cluster choice,
q-FFL's F_k(w)).

Streams: pass `stream=0` draws its batches (and torch's randomness) from the client's own stream
(seed, CLIENT, round, client), exactly as FedAvg's one pass does, so an algorithm whose first pass is the
plain local training reproduces FedAvg's model bit for bit; `stream=j >= 1` draws from (seed, PERSONAL,
round, client, j). Neither depends on -n or on where the client trains.
"""

from __future__ import annotations

import torch.nn.functional as F

from fedmpi.core import rng
from fedmpi.core.train import Schedule, evaluate, seed_torch_on, steps_per_epoch


class LocalPasses:
    """One client's local passes this round (the model is the rank's FlatModel, `host.flat`)."""

    def __init__(self, host, run, sched: Schedule):
        self.host, self.run, self.sched = host, run, sched
        self.steps = sched.steps                  # the client's scheduled steps this round (client.epochs/steps)
        self.batch_size = sched.batch_size
        self.epoch_steps = steps_per_epoch(run.n_samples, sched.batch_size, sched.drop_last)   # steps of one epoch

    def train(self, steps=None, grad_hook=None, loss_fn=None, step_hook=None, lr=None, stream=0, repeat=1):
        """One pass of `steps` SGD steps (None: the client's schedule) at `lr` (None: the round's eta_l), with
        the trainer's hooks, `repeat` steps on each batch; returns (sum of sample losses as a 0-d tensor,
        samples seen)."""
        host, run = self.host, self.run
        sched = self.sched if steps is None else Schedule(self.sched.batch_size, int(steps), self.sched.drop_last)
        purpose, keys = (rng.CLIENT, ()) if stream == 0 else (rng.PERSONAL, (int(stream),))
        seed = host.seed
        seed_torch_on(host.flat.device, seed, purpose, run.round, run.cid, *keys, 1)
        return host.trainer.train(host.client_idx[run.cid], rng.stream(seed, purpose, run.round, run.cid, *keys),
                                  sched, lr=run.lr if lr is None else lr, grad_hook=grad_hook, loss_fn=loss_fn,
                                  step_hook=step_hook, repeat=repeat)

    def loss(self):
        """Mean training loss of the model's current vector over the client's whole training set (no
        augmentation, eval mode); the trainer's criterion."""
        host = self.host
        idx = host.client_idx[self.run.cid]
        criterion = host.trainer.criterion
        _, loss = evaluate(host.flat.module, host.x_train[idx], host.y_train[idx], host.eval_batch,
                           loss=None if criterion is F.cross_entropy else criterion)
        return loss
