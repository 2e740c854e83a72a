"""Local SGD on one client, on the flat model (docs/explanation/design.md §4 `train`).

Batches are gathered by index from tensors that already live on the rank's device (no DataLoader per
client per round). The SGD step works on the flat vector and flat gradient: a few fused operations per
step whatever the number of layers.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedmpi.core import cpu_kernels, rng


@dataclass(frozen=True)
class Schedule:
    """How much one client trains in a round: `steps` batches of `batch_size` (epochs already resolved).
    `drop_last`: each epoch drops its short last batch (`client.drop_last`), as a DataLoader with
    drop_last=True does, except that an epoch of fewer than `batch_size` samples keeps its one short batch."""

    batch_size: int
    steps: int
    drop_last: bool = False


def steps_per_epoch(n_samples, batch_size, drop_last=False) -> int:
    """Batches in one pass over `n_samples`: ceil(n / B), or with `drop_last` floor(n / B) but at least one.

    The "at least one" is fedmpi's: a DataLoader with drop_last=True gives a client with fewer than B
    samples no batch at all (it would upload its start point unchanged, and SCAFFOLD's and FedNova's step
    counts would be zero); here such a client trains on its one short batch."""
    if drop_last:
        return max(1, n_samples // batch_size)
    return math.ceil(n_samples / batch_size)


def schedule(client_cfg, n_samples, batch_size=None) -> Schedule:
    b = batch_size or client_cfg.batch_size
    drop_last = bool(getattr(client_cfg, "drop_last", False))
    steps = client_cfg.steps or client_cfg.epochs * steps_per_epoch(n_samples, b, drop_last)
    return Schedule(b, steps, drop_last)


def batch_order(g: np.random.Generator, n_samples, sched: Schedule) -> list:
    """Positions 0..n-1 in the order the batches visit them: fresh shuffles, one per epoch, cut into
    `sched.steps` batches (the last batch of an epoch may be short, as with a DataLoader; with
    `sched.drop_last` it is dropped unless it is the epoch's only batch). The permutations drawn do not
    depend on `drop_last`, so the full batches are the same either way."""
    batches, b = [], sched.batch_size
    per_epoch = steps_per_epoch(n_samples, b, sched.drop_last)
    while len(batches) < sched.steps:
        perm = g.permutation(n_samples)
        batches.extend(perm[i * b:(i + 1) * b] for i in range(per_epoch))
    return batches[: sched.steps]


def seed_torch_on(device, seed, purpose, *keys):
    """`fedmpi.core.rng.seed_torch` for the generators of the CPU and of `device` only.

    Same seed, same generator states where this rank computes, at a fraction of the cost per client:
    `torch.manual_seed` also queues a lazy seeding of every CUDA device, which records a stack trace each
    time when CUDA is built in but not initialised (~1-5 ms per call, most of a small client's time)."""
    value = rng.torch_seed(seed, purpose, *keys)
    torch.default_generator.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.manual_seed(value)


class LocalTrainer:
    """Trains the rank's one FlatModel on index sets of the rank's device-resident training data."""

    def __init__(self, flat, client_cfg, x, y, transform=None, loss=None):
        self.flat, self.cfg, self.x, self.y = flat, client_cfg, x, y
        # Optional per-batch augmentation transform(xb, g), drawing from the client's generator `g`.
        self.transform = transform
        # The training criterion on (outputs, targets): cross-entropy unless a custom one is given
        # (`fedmpi.simulate(loss=...)`).
        self.criterion = loss or F.cross_entropy
        self.momentum_buf = (torch.zeros(flat.n_params, dtype=torch.float32, device=flat.device)
                             if client_cfg.momentum > 0 else None)
        # The momentum buffer of each parameter, for the step taken in the backward pass (`_param_step`).
        sizes = [p.numel() for p in flat.trainable]
        self._momentum_views = ([b.view_as(p) for b, p in zip(self.momentum_buf.split(sizes), flat.trainable)]
                                if self.momentum_buf is not None else None)
        self._stepped = [False] * len(sizes)
        # Batch-norm layers, which cannot take the statistics of a one-sample batch (`_batch_statistics_off`).
        self._batch_norms = [m for m in flat.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def loss(self, xb, yb):
        return self.criterion(self.flat.module(xb), yb)

    def train(self, indices: torch.Tensor, g: np.random.Generator, sched: Schedule, lr=None, grad_hook=None,
              loss_fn=None, step_hook=None, poison=None, repeat=1):
        """Runs `sched.steps` SGD steps from the model's current vector. Returns (sum of sample losses,
        samples seen) as a 0-d tensor and an int; the caller reads `flat.vec` for the result.
        `grad_hook(params, grad)` corrects the flat gradient before each step; `step_hook(params)` changes
        the parameters after each step (SCAFFOLD's `correction: after_step`). `poison(xb, yb) -> (xb, yb)`
        changes each batch after augmentation (a malicious client's data attack, fedmpi.attacks.data).
        `repeat` steps are taken on each batch (pFedMe's K steps towards its personal model), the batch drawn
        and augmented once; every step's loss counts."""
        cfg, flat, module = self.cfg, self.flat, self.flat.module
        lr = cfg.lr if lr is None else lr
        params = flat.params
        module.train()
        if self.momentum_buf is not None:
            self.momentum_buf.zero_()
        loss_sum = torch.zeros((), device=flat.device)
        seen = 0
        loss_of = loss_fn or self.loss
        # Without a grad_hook nothing needs the whole gradient at once: each parameter steps inside the backward
        # pass. The two ways give bit-identical parameters (the same element-wise operations; tested). Plain
        # SGD on the plain loss also lets the fast kernels' big dense layers step themselves inside their own
        # backward (cpu_kernels.fused_sgd: the same step to rounding, never their gradient made).
        if grad_hook is None:
            step = self._steps_in_backward(lr)
            stepping = contextlib.ExitStack()
            stepping.enter_context(flat.stepping_in_backward(lambda i, p, grad: self._param_step(i, p, grad, lr)))
            if loss_fn is None and not (self.cfg.weight_decay or self.momentum_buf is not None):
                stepping.enter_context(cpu_kernels.fused_sgd(module, lr))
        else:
            step, stepping = self._flat_step(lr, grad_hook), contextlib.nullcontext()
        with stepping:
            for positions in batch_order(g, len(indices), sched):
                idx = indices[torch.from_numpy(positions).to(indices.device, non_blocking=True)]
                xb, yb = self.x[idx], self.y[idx]
                if self.transform is not None:
                    xb = self.transform(xb, g)
                if poison is not None:
                    xb, yb = poison(xb, yb)
                for _ in range(repeat):
                    with _batch_statistics_off(self._batch_norms if len(positions) == 1 else ()):
                        loss = step(loss_of(xb, yb))
                    if step_hook is not None:
                        step_hook(params)
                    loss_sum += loss.detach() * len(positions)
                    seen += len(positions)
        return loss_sum, seen

    def _flat_step(self, lr, grad_hook):
        """One step on the flat gradient: backward accumulates into the zeroed `flat.grad`, the algorithm
        corrects it, then torch.optim.SGD's rule on the flat vector."""
        params, grad = self.flat.params, self.flat.grad

        def step(loss):
            grad.zero_()
            loss.backward()
            grad_hook(params, grad)
            with torch.no_grad():
                self._sgd(params, grad, self.momentum_buf, lr)
            return loss

        return step

    def _steps_in_backward(self, lr):
        """One step taken parameter by parameter inside backward (`_param_step`); a parameter that got no
        gradient (unused in this forward pass) steps with a zero gradient, as on the flat path."""
        trainable, stepped = self.flat.trainable, self._stepped
        decays = self.cfg.weight_decay or self.momentum_buf is not None

        def step(loss):
            stepped[:] = [False] * len(stepped)
            loss.backward()
            if decays and not all(stepped):
                for i, p in enumerate(trainable):
                    if not stepped[i]:
                        self._param_step(i, p, torch.zeros_like(p), lr)
            return loss

        return step

    def _param_step(self, i, p, grad, lr):
        self._stepped[i] = True
        with torch.no_grad():
            self._sgd(p, grad, self._momentum_views[i] if self._momentum_views else None, lr)

    def _sgd(self, params, grad, momentum_buf, lr):
        # torch.optim.SGD's rule: g += wd * w; buf = m * buf + g; w -= lr * buf.
        if self.cfg.weight_decay:
            grad.add_(params, alpha=self.cfg.weight_decay)
        if momentum_buf is not None:
            momentum_buf.mul_(self.cfg.momentum).add_(grad)
            grad = momentum_buf
        params.add_(grad, alpha=-lr)


@contextlib.contextmanager
def _batch_statistics_off(batch_norms):
    """While open, the batch-norm layers `batch_norms` that are training normalize with their running
    statistics and leave them unchanged, as in eval mode: for a batch of one sample (a client's short last
    batch, or a client of one sample), whose batch variance torch's BatchNorm refuses in training ("Expected
    more than 1 value per channel"). The batch still takes its gradient step; `client.drop_last: true` drops
    such batches instead (a client of one sample keeps its one)."""
    training = [m for m in batch_norms if m.training]
    for m in training:
        m.train(False)
    try:
        yield
    finally:
        for m in training:
            m.train(True)


@torch.no_grad()
def evaluate(module, x, y, batch_size, loss=None):
    """(accuracy, mean loss) of `module` on tensors x, y. With a custom criterion `loss(outputs, targets)`
    (mean over the batch) the loss is that criterion's, and accuracy is NaN unless outputs are class scores."""
    module.eval()
    correct = torch.zeros((), device=x.device)
    total = torch.zeros((), device=x.device, dtype=torch.float64)
    scores = True
    for i in range(0, len(y), batch_size):
        out = module(x[i:i + batch_size])
        yb = y[i:i + batch_size]
        if loss is None:
            total += F.cross_entropy(out, yb, reduction="sum").double()
        else:
            total += loss(out, yb).double() * len(yb)
        scores = scores and out.dim() == 2 and not yb.is_floating_point()
        if scores:
            correct += (out.argmax(dim=1) == yb).sum()
    n = max(len(y), 1)
    return (float(correct) / n if scores else float("nan")), float(total) / n


class ServerTrainer:
    """SGD on the server's own set, on rank 0: FSL's server learning, pretraining and data sharing's
    warm-up. Plain SGD (no momentum), batches from the stream (seed, SERVER, round); every epoch keeps its
    short last batch (`client.drop_last` is the clients' key). `test` (inputs, labels) lets a warm-up
    stop at a test accuracy (`train_until`)."""

    def __init__(self, flat, client_cfg, x, y, indices, seed, loss=None, test=None, eval_batch=1000):
        import dataclasses

        self.flat, self.seed = flat, seed
        self.indices = indices
        self.n = len(indices)
        self.test, self.eval_batch, self.loss = test, eval_batch, loss
        self.trainer = LocalTrainer(flat, dataclasses.replace(client_cfg, momentum=0.0), x, y, loss=loss)

    def steps_for(self, epochs, batch_size):
        return epochs * math.ceil(self.n / batch_size)

    def test_accuracy(self):
        """Accuracy of the model now in `flat` on the test set (NaN without one)."""
        if self.test is None:
            return float("nan")
        return evaluate(self.flat.module, *self.test, self.eval_batch, loss=self.loss)[0]

    def train_until(self, start, round_, max_epochs, batch_size, lr, target=None):
        """Epochs of SGD from `start` until the test accuracy after an epoch reaches `target`, at most
        `max_epochs` (None: all of them). Returns (vector, epochs run, test accuracy at the end). One stream
        (seed, SERVER, round) across the epochs, so E epochs here are exactly `train(start, round_, E *
        steps_for(1, B), B, lr)`."""
        self.flat.load(start)
        seed_torch_on(self.flat.device, self.seed, rng.SERVER, round_, 1)
        g = rng.stream(self.seed, rng.SERVER, round_)
        per_epoch = Schedule(batch_size, self.steps_for(1, batch_size))
        epochs, acc = 0, float("nan")
        while epochs < max_epochs:
            self.trainer.train(self.indices, g, per_epoch, lr=lr)
            epochs += 1
            if target is not None:
                acc = self.test_accuracy()
                if acc >= target:
                    break
        return self.flat.vec.clone(), epochs, acc

    def train(self, start, round_, steps, batch_size, lr):
        """`steps` SGD steps from `start`; returns (new vector, mean training loss)."""
        self.flat.load(start)
        seed_torch_on(self.flat.device, self.seed, rng.SERVER, round_, 1)
        loss_sum, seen = self.trainer.train(self.indices, rng.stream(self.seed, rng.SERVER, round_),
                                            Schedule(batch_size, steps), lr=lr)
        return self.flat.vec.clone(), float(loss_sum) / max(seen, 1)
