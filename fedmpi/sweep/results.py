"""What a sweep left, experiment by experiment, for the readers of a grid (tools/robustness.py,
tools/personalization.py, tools/reproduce.py): each experiment of the spec with the names of its sets (its
cell of the grid), its status and its run, read through fedmpi.analysis.

An experiment's run is OUT/NAME/run.h5 (the sweep's naming, docs/how-to/sweeps.md); its status is the run file's, else
the index's (OUT/index.csv: `refused`, `pending`...), else `missing` (the sweep never got to it). A run whose
recorded config disagrees with what the spec gives that experiment (another config in its folder) is not
taken: its status says so. Reading runs nothing and writes nothing.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from fedmpi.analysis import report
from fedmpi.core.errors import ConfigError
from fedmpi.sweep import index, spec

READY = "finished"


@dataclass
class Result:
    experiment: spec.Experiment     # .name, .labels {axis: set name}, .overrides (with its seed)
    folder: str
    status: str                     # finished, failed, diverged, refused, running, pending, ..., missing
    message: str = ""
    run: object = None              # the fedmpi.analysis Run where a run file of the experiment's config exists

    @property
    def seed(self):
        return self.experiment.overrides.get("seed")

    def cell(self, *axes):
        """The names of the experiment's sets on `axes` (all axes in the spec's order by default)."""
        labels = self.experiment.labels
        return tuple(labels[a] for a in axes) if axes else tuple(labels.values())


def read(spec_path, out=None, seeds=None, root="."):
    """(the Spec, [Result] in the spec's order) of the sweep of `spec_path` whose folder is `out` (default the
    spec's own `out`, relative to `root`: the folder the sweep was started in), the experiments of `seeds`
    only where given."""
    s = spec.load(spec_path)
    out = os.path.join(root, s.out) if out is None else out
    rows = index.read(out)
    results = []
    for exp in s.experiments:
        if seeds is not None and exp.overrides.get("seed") not in seeds:
            continue
        folder = exp.out(out)
        row = rows.get(exp.name)
        path = os.path.join(folder, "run.h5")
        # without its run file, only the index's word for an experiment that never ran is taken
        status = row.status if row and row.status != READY else "missing"
        result = Result(exp, folder, status, row.message if row and status != "missing" else "")
        if os.path.isfile(path):
            try:
                run = report.read_run(path)
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                result.status, result.message = "unreadable", f"{path}: {e}"
            else:
                wrong = disagreements(run.config, exp.overrides)
                if wrong:
                    result.status = "other config"
                    result.message = f"{path} records {', '.join(wrong)} unlike the spec"
                else:
                    result.run, result.status = run, run.attrs.get("status", result.status)
        results.append(result)
    return s, results


def disagreements(config, overrides):
    """The dotted keys of `overrides` whose value the resolved `config` does not hold (a mapping value: each of
    its keys; the resolved section may add defaults)."""
    wrong = []
    for key, value in overrides.items():
        if key == "out":
            continue
        node = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not _holds(node, value):
            wrong.append(f"{key}={node!r}")
    return wrong


def _holds(recorded, value):
    if isinstance(value, dict):
        return isinstance(recorded, dict) and all(_holds(recorded.get(k), v) for k, v in value.items())
    return recorded == value


def finished(results):
    """The runs of the experiments that finished."""
    return [r.run for r in results if r.status == READY]


def training_s(results):
    """Seconds of training of the finished runs, summed (each run's wall_s at its last round)."""
    walls = [np.asarray(run.metrics.get("wall_s", ()), dtype=np.float64) for run in finished(results)]
    return float(sum(np.nanmax(w) for w in walls if len(w)))


def missing_line(results, spec_shown):
    """One line naming what to run for the experiments without a finished run (None when every one has)."""
    absent = [r for r in results if r.status != READY]
    if not absent:
        return None
    names = ", ".join(f"{r.experiment.name} ({r.status})" for r in absent[:6])
    more = f" and {len(absent) - 6} more" if len(absent) > 6 else ""
    return (f"{len(absent)} of {len(results)} experiments have no finished run: {names}{more}; run "
            f"`mpiexec -n 3 fedmpi sweep {spec_shown}` (it keeps the finished ones)")


def read_for(script, spec_path, out=None, seeds=None, root=".", err=None):
    """`read` for a tool's command line: (its results, the missing line or None), the missing line said on `err`
    (default stderr) after SCRIPT's name; None, with the reason said, where the spec cannot be read."""
    err = err or sys.stderr
    try:
        _, results = read(spec_path, out, seeds, root)
    except ConfigError as e:
        print(f"{script}: {e}", file=err)
        return None
    missing = missing_line(results, os.path.relpath(spec_path, root))
    if missing:
        print(f"{script}: {missing}", file=err)
    return results, missing
