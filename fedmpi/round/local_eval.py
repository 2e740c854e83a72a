"""Local evaluation: each client's model on its own test split, on the rank hosting the client.

Every `eval.local_every` rounds (rounds t with (t + 1) % local_every == 0; not tied to the run's last round,
so a run stopped and resumed logs the very evaluations of an uninterrupted one) the evaluated clients
(`eval.local_clients`: the round's selected ones, or all N, those not in the round included) are evaluated
on their hosts, after the
round's server step: the algorithm's `eval_start(run, x, model)` loads what the client evaluates with (by
default the new global model with the client's personal entries), `eval.finetune_steps` > 0 runs that many
plain local SGD steps on the client's training split first (stream (seed, FINETUNE, round, client); the
FedAvg+FT baseline; the result is discarded), then accuracy and loss on its test split. The same client's
split is also evaluated with the global model alone, for `local_below_global`.

The per-client figures travel in one float64 reduction of [4, N] (accuracy, loss, the global model's
accuracy, evaluated flag): each client's entries are set by exactly one rank (its host) and are zero
elsewhere, so the sum is exact and the figures do not depend on -n. Nothing here keeps state: a resumed
run evaluates the same.

Figures (`local_figures`, pure, on rank 0), over the evaluated clients with a non-empty test split:
  local_acc_mean        sample-weighted mean accuracy: sum_i m_i a_i / sum_i m_i (m_i: test split size)
  local_acc_unweighted  mean of the a_i
  local_acc_std         their standard deviation (population, ddof 0)
  local_acc_worst10     mean of the k lowest a_i, k = max(1, floor(0.1 * clients evaluated))
  local_acc_worst       min a_i
  local_below_global    share of the clients whose a_i is strictly below the global model's accuracy on that
                        same client's test split (0 for FedAvg-like algorithms without fine-tuning, whose
                        evaluated model is the global one)
  local_loss_mean       sample-weighted mean loss
"""

from __future__ import annotations

import numpy as np
import torch

from fedmpi.core import rng
from fedmpi.core.train import Schedule, evaluate, seed_torch_on

ACC, LOSS, GLOBAL_ACC, EVALUATED = range(4)
FIGURES = ("local_acc_mean", "local_acc_unweighted", "local_acc_std", "local_acc_worst10", "local_acc_worst",
           "local_below_global", "local_loss_mean")
COLUMNS = ("local_acc", "local_loss")


def local_figures(acc, loss, global_acc, sizes) -> dict:
    """The /metrics figures of one local evaluation from the evaluated clients' accuracies, losses, the global
    model's accuracies on their splits and their test split sizes (arrays of equal length)."""
    acc, loss, global_acc = (np.asarray(a, dtype=np.float64) for a in (acc, loss, global_acc))
    sizes = np.asarray(sizes, dtype=np.float64)
    if len(acc) == 0:
        return dict.fromkeys(FIGURES, np.nan)
    k = max(1, int(np.floor(0.1 * len(acc))))
    return {
        "local_acc_mean": float(np.dot(sizes, acc) / sizes.sum()),
        "local_acc_unweighted": float(acc.mean()),
        "local_acc_std": float(acc.std()),
        "local_acc_worst10": float(np.sort(acc)[:k].mean()),
        "local_acc_worst": float(acc.min()),
        "local_below_global": float(np.mean(acc < global_acc)),
        "local_loss_mean": float(np.dot(sizes, loss) / sizes.sum()),
    }


class LocalEvaluation:
    """The local evaluation of one rank's hosted clients. `local_test` is the split's LocalTest; `data` the
    experiment's DeviceData (its train or test tensors hold the splits)."""

    def __init__(self, eval_cfg, client, seed, comm, clients, algo, flat, data, local_test, store, loss=None):
        """`eval_cfg`: the `eval` section; `client`: the `client` section (the fine-tuning's batches); `seed`: the
        run's seed. `store`: the rank's ClientStateStore, whose device copies made for the evaluation are dropped
        after it (with `local_clients: all` they would otherwise stay on a GPU until the next round's end)."""
        self.comm, self.clients, self.algo, self.flat = comm, clients, algo, flat
        self.client, self.seed, self.store = client, seed, store
        self.every, self.scope = eval_cfg.local_every, eval_cfg.local_clients
        self.finetune_steps, self.batch = eval_cfg.finetune_steps, eval_cfg.batch_size
        self.data, self.local_test, self.loss = data, local_test, loss
        self.num_clients = len(clients.parts)
        self.sizes = local_test.sizes
        self.buffer = np.zeros((4, self.num_clients), dtype=np.float64)

    def due(self, t) -> bool:
        # Not "or the last round": a shorter first run followed by --resume would then log one more.
        return self.every is not None and (t + 1) % self.every == 0

    def clients_of(self, plan):
        """The clients this evaluation covers, in increasing id."""
        if self.scope == "all":
            return np.arange(self.num_clients)
        return np.sort(np.asarray(plan.selected, dtype=np.int64))

    def _tensors(self):
        return self.data.train if self.local_test.source == "train" else self.data.test

    def run(self, plan, x):
        """Collective: every rank evaluates its hosted clients of the evaluation with the global model `x` (on
        this rank's device, `dim` entries); returns (figures, columns) on the server, None elsewhere."""
        buf = self.buffer
        buf[:] = 0.0
        covered = self.clients_of(plan)
        mine = [int(c) for c in covered if int(c) in self.clients.mine and self.sizes[int(c)] > 0]
        if mine:
            x_all, y_all = self._tensors()
            for cid in mine:
                idx = torch.from_numpy(self.local_test.parts[cid]).to(self.flat.device)
                xs, ys = x_all[idx], y_all[idx]
                buf[ACC, cid], buf[LOSS, cid] = self._client(plan.round, cid, x, xs, ys)
                self.flat.load(x)
                buf[GLOBAL_ACC, cid] = self._evaluate(xs, ys)[0]
                buf[EVALUATED, cid] = 1.0
            self.store.end_round()
        self.comm.reduce_sum(buf.reshape(-1))
        if not self.comm.is_server:
            return None
        done = buf[EVALUATED] > 0
        figures = local_figures(buf[ACC, done], buf[LOSS, done], buf[GLOBAL_ACC, done], self.sizes[done])
        columns = {name: np.where(done, buf[row], np.nan).astype(np.float32)
                   for name, row in (("local_acc", ACC), ("local_loss", LOSS))}
        return figures, columns

    def _client(self, t, cid, x, xs, ys):
        """(accuracy, loss) of client `cid`'s evaluation model (fine-tuned where asked) on its split."""
        run = self.clients.new_run(t, cid)
        self.algo.eval_start(run, x, self.flat)
        if self.finetune_steps:
            self._finetune(t, cid)
        return self._evaluate(xs, ys)

    def _finetune(self, t, cid):
        """`finetune_steps` plain SGD steps (the client's lr of round t and batch size) on its training split,
        with its own stream (seed, FINETUNE, t, cid): no algorithm hooks, nothing kept."""
        clients, seed = self.clients, self.seed
        seed_torch_on(self.flat.device, seed, rng.FINETUNE, t, cid, 1)
        sched = Schedule(self.client.batch_size, self.finetune_steps, self.client.drop_last)
        clients.trainer.train(clients.client_idx[cid], rng.stream(seed, rng.FINETUNE, t, cid), sched,
                              lr=clients.new_run(t, cid).lr)

    @torch.no_grad()
    def _evaluate(self, xs, ys):
        return evaluate(self.flat.module, xs, ys, self.batch, loss=self.loss)
