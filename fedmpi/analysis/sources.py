"""Finding run files (files, run folders, folders searched recursively, globs) and reading them, one warning
line for each that cannot be read: the one reader every view of fedmpi.analysis goes through."""

from __future__ import annotations

import glob
import json
import os
import sys

from fedmpi.analysis import report


def find_run_files(paths):
    """run.h5 files named by `paths`: files, run folders, folders searched recursively (a sweep's parent
    folder) and glob patterns of any of these; in the order given, without duplicates.
    Returns (files, the paths that named none)."""
    found, unmatched = [], []
    for path in paths:
        matches = []
        for item in [path] if os.path.exists(path) else sorted(glob.glob(path, recursive=True)):
            if not os.path.isdir(item):     # a FIFO or a device too: refused by name when read (open_run)
                matches.append(item)
            elif os.path.isfile(os.path.join(item, "run.h5")):
                matches.append(os.path.join(item, "run.h5"))
            elif os.path.isdir(item):
                matches += sorted(glob.glob(os.path.join(item, "**", "run.h5"), recursive=True))
        if not matches:
            unmatched.append(path)
        seen = {os.path.abspath(f) for f in found}
        found += [m for m in matches if os.path.abspath(m) not in seen]
    return found, unmatched


def load_runs(paths, err=None):
    """Reads every run file found in `paths`; one that cannot be read is reported on `err` (default
    stderr) and left out."""
    err = err or sys.stderr
    files, _ = find_run_files(paths)
    runs = []
    for path in files:
        try:
            runs.append(report.read_run(path))
        except report.MalformedRun as e:
            print(f"fedmpi: warning: skipping {path}: not a valid run file: {report.one_line(e)}", file=err)
        except Exception as e:  # noqa: BLE001 - one foreign file must not end a table over many runs
            print(f"fedmpi: warning: skipping {path}: cannot read it ({type(e).__name__}: {report.one_line(e)})",
                  file=err)
    return runs


def sweep_sets(run):
    """The sweep's set names of a run that `fedmpi sweep` started (its `sweep_sets` attribute, {axis: name}) as
    columns: `set` (the set's name; with several lists of sets, their names joined by "/") and `set.AXIS`
    for each named list (`sets: {split: [...], method: [...]}` gives set.split and set.method). None for a
    run that no sweep with sets started."""
    try:
        labels = json.loads(run.attrs.get("sweep_sets") or "{}")
    except (TypeError, ValueError):
        labels = {}
    if not isinstance(labels, dict) or not labels:
        return {"set": None}
    out = {"set": "/".join(str(v) for v in labels.values())}
    out.update({"set." + axis.removeprefix("sets."): str(v) for axis, v in labels.items() if axis != "sets"})
    return out


def config_value(run, key):
    """The value of a dotted config key in a run's resolved config (`algorithm` alone gives its name; `method`
    the run's method label, fedmpi.analysis.labels; `set` and `set.AXIS` the sweep's set names, `sweep_sets`)."""
    if key == "method":
        return run.method
    if key == "set" or key.startswith("set."):
        return sweep_sets(run).get(key)
    node = run.config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node.get("name") if isinstance(node, dict) else node


def run_label(run, keys=()):
    return ", ".join(f"{k}={config_value(run, k)}" for k in keys) if keys else run.name
