"""`fedmpi verify RUN_A RUN_B`: do two runs compute the same models, and where do they part?

The models are compared by their per-round fingerprints (`/metrics/model_sha256`, the SHA-256 of the
float32 bytes of the global vector after each round) over the rounds both runs have, so the command works
on finished, running (read up to the last complete round) and preempted runs alike. Files written before
fingerprints existed are compared by their per-round metrics and final model instead, and the report says
so. Around the verdict: both runs' status, rounds, process count (-n), library versions, and their config
differences as dotted keys.

Across process counts fedmpi computes identical models on CPUs at the same torch thread count, and agrees to
TOLERANCE otherwise (other thread counts, GPUs; docs/explanation/determinism.md), so when the world sizes differ
the report gives each common per-round metric's and the final model's largest relative difference against
it, and says which of the two promises applies. Exit 0: identical (or, across process counts, within the
tolerance; or no round in common yet); 1: they differ; 2: a file is missing or not a run file.

This module reads and compares; `fedmpi.analysis.verify_report` words the result and is the command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import h5py
import numpy as np

from fedmpi.analysis import report
from fedmpi.core.errors import InputError
from fedmpi.core.fingerprint import fingerprint
from fedmpi.io.store import open_run

TOLERANCE = 1e-5                # relative; docs/explanation/determinism.md, across -n at different thread counts
NOT_REPRODUCIBLE = ("wall_s",)  # measured time, different on every run
FINAL_MODEL_STATUSES = ("finished", "preempted")    # /model/global is written at these ends only


@dataclass
class Side:
    """One run as verify sees it."""

    label: str
    run: report.Run
    model: np.ndarray | None

    @property
    def rounds(self):
        """The rounds of the run's rows, 1-based as everywhere a person reads them (/metrics/round + 1)."""
        return np.asarray(self.run.metrics["round"], dtype=np.float64) + 1

    @property
    def status(self):
        return str(self.run.attrs.get("status", "?"))

    @property
    def world_size(self):
        value = self.run.attrs.get("world_size")
        return int(value) if isinstance(value, (int, np.integer)) else None

    @property
    def threads(self):
        """torch threads per rank as recorded (None in files that predate it)."""
        value = self.run.attrs.get("threads")
        return int(value) if isinstance(value, (int, np.integer)) else None

    def fingerprints(self):
        """Hex fingerprints per row ('' where a row has none), or None when the file records none."""
        values = self.run.metrics.get("model_sha256")
        if values is None:
            return None
        return [v.decode("ascii", errors="replace") if isinstance(v, bytes) else str(v) for v in values]


@dataclass
class Comparison:
    common: list                        # the round values both runs have, ascending
    basis: str                          # "fingerprints" or "metrics"
    first_difference: int | None        # the first common round whose model (or metrics) differ
    differing_figures: list             # by metrics: the figures that differ in that round
    model: str                          # what the final-model comparison found, in words
    model_equal: bool | None            # None: not comparable
    differences: list = field(default_factory=list)    # (name, largest relative difference, at round)
    notes: list = field(default_factory=list)

    @property
    def within_tolerance(self):
        return all(rel <= TOLERANCE for _, rel, _ in self.differences)

    @property
    def identical(self):
        return self.first_difference is None and self.model_equal is not False


# --- reading --------------------------------------------------------------------------------------------

def load_side(path, label):
    """The run at `path` (a run.h5 or its folder); InputError naming the path when it is not a run file."""
    file = os.path.join(path, "run.h5") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise InputError(f"{path}: no run file there (expected a run.h5 or a run folder holding one)")
    try:
        run = report.read_run(file)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a bad input here, named with its reason
        raise InputError(f"{file}: cannot read it as a run file: {report.one_line(e)}") from None
    return Side(label, run, _read_model(file))


def _read_model(path):
    with open_run(path) as f:
        item = f.get("model/global")
        if isinstance(item, h5py.Dataset) and item.dtype.kind == "f" and item.ndim == 1:
            return np.asarray(item[()], dtype=np.float32)
    return None


# --- comparing ------------------------------------------------------------------------------------------

def _row_of(side):
    """{round value: row}; a round logged twice (it should not be) counts with its last row."""
    return {int(r): i for i, r in enumerate(side.rounds) if np.isfinite(r)}


def compare(a: Side, b: Side) -> Comparison:
    rows_a, rows_b = _row_of(a), _row_of(b)
    common = sorted(set(rows_a) & set(rows_b))
    ia, ib = [rows_a[r] for r in common], [rows_b[r] for r in common]
    fa, fb = a.fingerprints(), b.fingerprints()
    notes = []
    if fa is not None and fb is not None:
        basis, first, figures = "fingerprints", _first_fingerprint_difference(common, ia, ib, fa, fb, notes), []
    else:
        lacking = " and ".join(s.label for s, f in ((a, fa), (b, fb)) if f is None)
        notes.append(f"model fingerprints not recorded in {lacking} (/metrics/model_sha256; a file from "
                     f"before fingerprints): compared /metrics and /model/global instead")
        basis, (first, figures) = "metrics", _first_metric_difference(a, b, common, ia, ib)
    differences = _metric_differences(a, b, common, ia, ib, notes)
    model, model_equal, model_rel = _compare_models(a, b)
    if model_rel is not None:
        differences.append(("/model/global", model_rel, None))
    for side, fp in ((a, fa), (b, fb)):
        notes += _fingerprint_check(side, fp)
    return Comparison(common, basis, first, figures, model, model_equal, differences, notes)


def _first_fingerprint_difference(common, ia, ib, fa, fb, notes):
    both = [k for k in range(len(common)) if fa[ia[k]] and fb[ib[k]]]
    if len(both) < len(common):
        notes.append(f"{len(common) - len(both)} of the {len(common)} common rounds lack a fingerprint in one "
                     f"of the runs; those rounds were not compared")
    return next((common[k] for k in both if fa[ia[k]] != fb[ib[k]]), None)


def _deterministic_metrics(a, b):
    """The per-round figures both runs log that a rerun reproduces (not the measured times)."""
    names = []
    for name in sorted(set(a.run.metrics) & set(b.run.metrics)):
        if name == "round" or name in NOT_REPRODUCIBLE or name in report.TEXT_METRICS:
            continue
        names.append(name)
    return names


def _first_metric_difference(a, b, common, ia, ib):
    """(the first common round where a reproducible metric differs, the names of those that do)."""
    names = _deterministic_metrics(a, b)
    for k, r in enumerate(common):
        differ = [name for name in names if not _same(a.run.metrics[name][ia[k]], b.run.metrics[name][ib[k]])]
        if differ:
            return r, differ
    return None, []


def _same(x, y):
    x, y = np.asarray(x), np.asarray(y)
    return x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=True))


def relative_difference(x, y):
    """|x - y| / max(|x|, |y|) elementwise: 0 where equal (both NaN included), inf where only one was
    measured (NaN) or the values cannot be compared."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    with np.errstate(all="ignore"):
        rel = np.abs(x - y) / np.maximum(np.abs(x), np.abs(y))
    rel = np.where(np.isnan(rel), np.inf, rel)
    return np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0.0, rel)


def _metric_differences(a, b, common, ia, ib, notes):
    """(name, largest relative difference over the common rounds, at which round) per common metric."""
    out = []
    for name in _deterministic_metrics(a, b):
        x, y = np.asarray(a.run.metrics[name])[ia], np.asarray(b.run.metrics[name])[ib]
        if x.shape != y.shape:
            notes.append(f"/metrics/{name} has shape {x.shape[1:]} per round in {a.label} but {y.shape[1:]} "
                         f"in {b.label}")
            out.append((name, np.inf, None))
            continue
        if not len(x):
            continue
        per_round = relative_difference(x, y).reshape(len(x), -1).max(axis=1)
        worst = int(np.argmax(per_round))
        out.append((name, float(per_round[worst]), common[worst] if per_round[worst] > 0 else None))
    return out


def _compare_models(a, b):
    """(words, equal or None, largest relative difference or None) of the two /model/global vectors,
    compared only where both are the models after the same last round."""
    for side in (a, b):
        if side.model is None:
            return f"not compared: {side.label} has no /model/global", None, None
        if side.status not in FINAL_MODEL_STATUSES:
            return (f"not compared: {side.label} is {side.status} (/model/global is written when a run "
                    f"finishes or is preempted)", None, None)
    last_a, last_b = (int(s.rounds[-1]) if len(s.rounds) else None for s in (a, b))
    if last_a != last_b:
        return f"not compared: {a.label} ends after round {last_a}, {b.label} after round {last_b}", None, None
    if a.model.shape != b.model.shape:
        return f"differ in size ({a.model.size} and {b.model.size} parameters)", False, np.inf
    equal = bool(np.array_equal(a.model, b.model))
    scale = float(max(np.abs(a.model).max(initial=0.0), np.abs(b.model).max(initial=0.0)))
    diff = float(np.abs(a.model.astype(np.float64) - b.model).max(initial=0.0))
    rel = 0.0 if equal else (diff / scale if scale > 0 and np.isfinite(diff) else np.inf)
    words = "bit-identical" if equal else f"differ: largest difference {diff:.3g} ({rel:.3g} of the largest weight)"
    return f"{words} (after round {last_a})", equal, rel


def _fingerprint_check(side, fps):
    """A final model that does not match its own last fingerprint means an edited or mixed-up file."""
    if fps is None or side.model is None or side.status not in FINAL_MODEL_STATUSES or not fps or not fps[-1]:
        return []
    if fingerprint(side.model) == fps[-1]:
        return []
    return [f"{side.label}'s /model/global does not match its last fingerprint (round {int(side.rounds[-1])}): "
            f"the file was edited, or the model and the metrics come from different runs"]
