"""A finished run's model, rebuilt in this process to evaluate any flat vector of it: the global model of a
checkpoint, or a model a contribution study composed from recorded updates (fedmpi.analysis.contribution_rounds).

    ev = RunEvaluator.from_run("runs/quickstart")
    loss, acc = ev.evaluate(ev.final_vector("runs/quickstart"))       # the run's last test_loss, test_acc
    loss, acc = ev.evaluate(vector_at("runs/quickstart", 10), clients=[3, 7])   # on those clients' samples

What a run builds on every rank (fedmpi.run.setup.experiment), from the config stored in run.h5: the data
set (fedmpi.data.load.load_dataset, what a rank loads when nothing is shared), the partition
(build_partition), the initial model from the seed (build_model after seed_torch(seed, INIT), the algorithm's
prepare_model, FlatModel, the CPU kernels where the run's `runtime.kernels` gives them), on the CPU. The test
set is the run's own: the `eval.max_samples` subsample where the run evaluated on one (the same seeded draw,
fedmpi.round.evaluation.eval_subset, as run.h5's /eval/test_indices), batches of `eval.batch_size`, and the
loss summed batch by batch in float64 in batch order as SplitEvaluation adds them, so that a checkpoint's
figures are the run's recorded ones.

The config is built into a Config (fedmpi.config.from_dict), which imports a plug-in (a `module:Class` model,
data set or algorithm) it names: evaluate only runs you trust.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

from fedmpi.core.errors import InputError


def stored_run_config(out):
    """The Config a run stored in OUT/run.h5 (its root attribute `config`, the resolved YAML, parsed as every
    reader of run files does: fedmpi.analysis.report.parse_config); InputError naming the file where it is
    missing or unreadable."""
    from fedmpi.analysis.report import MalformedRun, parse_config
    from fedmpi.config import from_dict
    from fedmpi.core.errors import ConfigError
    from fedmpi.io.store import open_run

    path = os.path.join(out, "run.h5")
    if not os.path.exists(path):
        raise InputError(f"{path}: no run file; expected the `out` folder of a fedmpi run")
    with open_run(path) as f:
        text = f.attrs.get("config", "")
    try:
        stored = parse_config(text)
    except MalformedRun as e:
        raise InputError(f"{path}: its stored config cannot be read ({e})") from None
    if not stored:
        raise InputError(f"{path}: root attribute config is missing; a run file stores its resolved config there")
    try:
        return from_dict(stored)
    except ConfigError as e:
        raise InputError(f"{path}: its stored config does not make a config of this fedmpi ({e})") from None


def checkpoint_rounds(out) -> list:
    """The rounds after which OUT/ckpt holds a checkpoint, oldest first."""
    from fedmpi.io import checkpoint

    return sorted(r for r, _ in checkpoint.list_checkpoints(out))


def vector_at(out, round_) -> np.ndarray:
    """The global flat vector after `round_` rounds (1-based: after the run's round `round_`, /metrics row
    `round_ - 1`), from OUT/ckpt/ckpt-<round>.h5, its checksum verified. InputError naming the checkpoints
    there where none was taken after that round or it is damaged."""
    from fedmpi.io import checkpoint

    path = checkpoint.ckpt_path(out, int(round_))
    if not os.path.exists(path):
        have = ", ".join(map(str, checkpoint_rounds(out))) or "none"
        raise InputError(f"{path}: no checkpoint after round {round_} (checkpoints after rounds: {have}; "
                         f"`checkpoint.every` and `checkpoint.keep` decide which a run keeps)")
    try:
        checkpoint.verify(path)
    except checkpoint.DamagedCheckpoint as e:
        raise InputError(f"checkpoint {path} is damaged ({e})") from None
    with h5py.File(path, "r", locking=False) as f:
        return np.asarray(f["global"][()])


def final_vector(out) -> np.ndarray:
    """The run's final global model: run.h5's /model/global, written when a run finishes or is preempted (the
    model after its last round, /metrics' last row). InputError where the run wrote none (failed, or still
    running: take `vector_at` a checkpoint's round instead)."""
    from fedmpi.io.store import open_run

    path = os.path.join(out, "run.h5")
    with open_run(path) as f:
        item = f.get("model/global")
        if item is None:
            status = f.attrs.get("status", "unknown")
            raise InputError(f"{path}: no /model/global (run status {status!r}; a run writes it when it finishes "
                             f"or is preempted); checkpoints after rounds: "
                             f"{', '.join(map(str, checkpoint_rounds(out))) or 'none'} (vector_at)")
        return np.asarray(item[()])


class RunEvaluator:
    """A run's model and data on the CPU (`from_run`); `evaluate` loads a flat vector and measures it."""

    final_vector = staticmethod(final_vector)
    vector_at = staticmethod(vector_at)

    def __init__(self, cfg, dataset, parts, flat):
        """`cfg` a Config, `dataset` its Dataset, `parts` the clients' index arrays into the training set,
        `flat` the FlatModel of the run's model."""
        from fedmpi.round.evaluation import eval_subset

        self.cfg, self.dataset, self.parts, self.flat = cfg, dataset, parts, flat
        self.test_indices = eval_subset(len(dataset.y_test), cfg.eval.max_samples, cfg.seed)
        self.batch_size = cfg.eval.batch_size

    @classmethod
    def from_run(cls, out) -> RunEvaluator:
        """The evaluator of the run in folder `out`, built from its stored config as each rank builds it."""
        from fedmpi.algorithms import prepare_model
        from fedmpi.core import cpu_kernels, rng
        from fedmpi.core.flat import FlatModel
        from fedmpi.core.models import build_model
        from fedmpi.data.load import load_dataset
        from fedmpi.round.experiment import build_partition

        cfg = stored_run_config(out)
        dataset = load_dataset(cfg)
        split = build_partition(cfg, dataset)
        rng.seed_torch(cfg.seed, rng.INIT)
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes, cfg.lora)
        prepare_model(cfg, model)
        flat = FlatModel(model, "cpu")
        if cpu_kernels.wanted(cfg.runtime.kernels, cfg.model.name, "cpu"):
            cpu_kernels.use_fast_kernels(flat)
        return cls(cfg, dataset, split.parts, flat)

    @property
    def num_clients(self) -> int:
        return len(self.parts)

    def samples(self, clients=None):
        """(inputs, labels) evaluated for `clients`: the run's test set (None), or the union of the listed
        clients' training samples (the partition's, before an algorithm that shares data adds to them)."""
        ds = self.dataset
        if clients is None:
            if self.test_indices is None:
                return ds.x_test, ds.y_test
            return ds.x_test[self.test_indices], ds.y_test[self.test_indices]
        chosen = sorted({int(c) for c in clients})
        bad = [c for c in chosen if not 0 <= c < len(self.parts)]
        if bad or not chosen:
            raise InputError(f"clients = {list(clients)}: expected client ids in 0..{len(self.parts) - 1}, at least "
                             f"one (None: the test set)")
        index = np.unique(np.concatenate([np.asarray(self.parts[c], dtype=np.int64) for c in chosen]))
        return ds.x_train[index], ds.y_train[index]

    def evaluate(self, vector, clients=None) -> tuple[float, float]:
        """(mean loss, accuracy) of the model with flat vector `vector` on the run's test set (`clients` None)
        or on the union of the listed clients' training samples. Cross-entropy as the run measures test_loss;
        accuracy NaN where the task has no class labels (float targets, outputs that are not [batch, class])."""
        import torch
        import torch.nn.functional as F

        vec = torch.as_tensor(np.asarray(vector, dtype=np.float32))
        if vec.shape != (self.flat.dim,):
            raise InputError(f"vector: shape {tuple(vec.shape)}; this run's model is a flat vector of "
                             f"{self.flat.dim} entries")
        x, y = self.samples(clients)
        self.flat.load(vec)
        module = self.flat.module
        module.eval()
        labelled = y.dtype.kind != "f"
        total, correct, n = 0.0, 0, len(y)
        with torch.no_grad():
            for start in range(0, n, self.batch_size):
                xb = torch.from_numpy(np.ascontiguousarray(x[start:start + self.batch_size]))
                yb = torch.from_numpy(np.ascontiguousarray(y[start:start + self.batch_size]))
                out = module(xb)
                total += float(F.cross_entropy(out, yb, reduction="sum").double())
                labelled = labelled and out.dim() == 2
                if labelled:
                    correct += int((out.argmax(dim=1) == yb).sum())
        n = max(n, 1)
        return total / n, (correct / n if labelled else float("nan"))

    def utility(self, metric="accuracy", clients=None):
        """A function vector -> float for the contribution estimates (fedmpi.analysis.contribution_rounds):
        `metric` "accuracy", or "neg_loss" (minus the mean loss: larger is better, as a utility must be)."""
        if metric not in ("accuracy", "neg_loss"):
            raise ValueError(f"metric = {metric!r}: expected 'accuracy' or 'neg_loss'")
        pick = 1 if metric == "accuracy" else 0
        sign = 1.0 if metric == "accuracy" else -1.0
        return lambda vector: sign * self.evaluate(vector, clients)[pick]
