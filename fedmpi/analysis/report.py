"""Reading run files and summarising them: the table of `fedmpi report` (and of tools/). The figures themselves
and their definitions are in `fedmpi.analysis.figures`."""

from __future__ import annotations

import csv
import os
import time
from dataclasses import dataclass, field
from functools import cached_property

import h5py
import numpy as np

import fedmpi.analysis.figures as figures
from fedmpi.analysis.figures import WINDOW, bytes_moved, mean_client_emd, rolling_mean  # noqa: F401 - public here
from fedmpi.analysis.labels import algorithm_name, method_label
from fedmpi.config import yamlio
from fedmpi.core.errors import ConfigError
from fedmpi.core.output_paths import replace_with
from fedmpi.io.store import CORE_METRICS, open_run, read_clients

READ_RETRIES = 5


@dataclass
class Run:
    path: str
    attrs: dict
    metrics: dict
    partition: dict = field(default_factory=dict)
    server_partition: dict = field(default_factory=dict)
    metric_attrs: dict = field(default_factory=dict)    # {metric: its dataset's attributes}, e.g. class_counts
    timing: dict = field(default_factory=dict)          # {phase: [round, rank] seconds} from /timing
    groups: dict = field(default_factory=dict)          # small optional groups: /attack, /partition/shared

    @property
    def name(self):
        return os.path.basename(os.path.dirname(os.path.abspath(self.path))) or self.path

    @cached_property
    def config(self):
        return parse_config(self.attrs.get("config", ""))

    @cached_property
    def method(self):
        """The method's label: the algorithm with what distinguishes it (fedmpi.analysis.labels)."""
        return method_label(self.config)

    def client_figure(self, name):
        """/clients/NAME as [round, client] (rounds cut to the complete /metrics rows), read on first use; None
        where the run did not record it or the file cannot be read now."""
        cache = self.__dict__.setdefault("_clients", {})
        if name not in cache:
            try:
                table = read_clients(self.path, len(self.metrics.get("round", []))).get(name)
            except (OSError, KeyError, ValueError, RuntimeError):
                table = None
            cache[name] = table
        return cache[name]


class MalformedRun(ValueError):
    """A readable HDF5 file that is not a run log as docs/explanation/design.md §3 describes it; never retried."""


def parse_config(text):
    """The resolved config stored in a run file, as a mapping ({} when absent); MalformedRun otherwise."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise MalformedRun(f"config attribute is a {type(text).__name__}, not YAML text")
    try:
        # fedmpi's own loader: YAML 1.2 core as written, with the limits on size, depth and aliases.
        config = yamlio.load(text, "config attribute")
    except ConfigError as e:
        raise MalformedRun(one_line(e)) from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise MalformedRun(f"config attribute is YAML but not a mapping of keys (a {type(config).__name__})")
    return config


def one_line(error, limit=200):
    """An exception's text on one line, cut to `limit` characters (warnings and errors are one line)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_run(path, retries=READ_RETRIES) -> Run:
    """One run file, also while its job is still appending to it (a read that meets a half-written round
    is retried). A file that is not HDF5 at all raises OSError at once; a malformed one MalformedRun.
    HDF5 reports a half-written object as OSError, KeyError or ValueError, and a group whose heap the writer
    is extending as RuntimeError ("addr overflow"): all of them are retried."""
    if os.path.isfile(path) and not h5py.is_hdf5(path):
        raise OSError(f"{path} is not an HDF5 file")
    for attempt in range(retries):
        try:
            return _read_run(path)
        except MalformedRun:
            raise
        except (OSError, KeyError, ValueError, RuntimeError):
            if attempt == retries - 1:
                raise
            time.sleep(0.1 * (attempt + 1))


# Numbers (and booleans); the fingerprints of /metrics/model_sha256 are the one text column.
_NUMERIC_KINDS = "biuf"
TEXT_METRICS = ("model_sha256",)


def _read_run(path) -> Run:
    with open_run(path) as f:
        attrs = {k: (v.decode(errors="replace") if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        if not isinstance(f.get("metrics"), h5py.Group):
            raise MalformedRun("no /metrics group" if "metrics" not in f else "/metrics is not a group")
        metrics = {k: _dataset(f["metrics"], k, k in TEXT_METRICS) for k in f["metrics"]}
        if "round" not in metrics:
            raise MalformedRun("no /metrics/round")
        metric_attrs = {k: dict(f["metrics"][k].attrs) for k in metrics if len(f["metrics"][k].attrs)}
        n = min(len(v) for v in metrics.values())
        metrics = {k: v[:n] for k, v in metrics.items()}   # a row may be mid-append
        part = _numeric_group(f, "partition")
        server = _numeric_group(f, "partition/server")
        timing = {k: v[:n] for k, v in _numeric_group(f, "timing").items() if v.ndim == 2}
        groups = {name: _numeric_group(f, name) for name in ("attack", "partition/shared") if name in f}
    run = Run(path, attrs, metrics, part, server, metric_attrs, timing, groups)
    _ = run.config  # parsed (and checked) now, so a malformed file is skipped here, not half-way through a table
    return run


def _dataset(group, name, text=False):
    item = group[name]
    if not isinstance(item, h5py.Dataset):
        raise MalformedRun(f"{group.name}/{name} is a group, not a dataset")
    kinds = "S" if text else _NUMERIC_KINDS
    if item.dtype.kind not in kinds or item.ndim not in (1, 2):
        what = "text" if text else "numbers"
        raise MalformedRun(f"{group.name}/{name} holds {item.ndim}-D {item.dtype} data, not per-round {what}")
    if item.ndim != 1 and name in CORE_METRICS:
        raise MalformedRun(f"{group.name}/{name} is {item.ndim}-D; a core figure has one value per round")
    return item[()]


def _numeric_group(f, name):
    """The datasets of an optional group ({} if absent); a non-numeric one makes the file malformed."""
    group = f.get(name)
    if group is None:
        return {}
    if not isinstance(group, h5py.Group):
        raise MalformedRun(f"/{name} is not a group")
    out = {}
    for k, item in group.items():
        if isinstance(item, h5py.Dataset):
            if item.dtype.kind not in _NUMERIC_KINDS:
                raise MalformedRun(f"/{name}/{k} holds {item.dtype} data, not numbers")
            out[k] = item[()]
    return out


def accuracy_figures(rounds, acc, window=WINDOW):
    """(acc_last20_mean, best, rise round) of test accuracies `acc` at 0-based `rounds` (NaN where not
    evaluated): fedmpi.analysis.figures' definitions for arrays (tools/ that hold no run use it)."""
    run = Run("", {}, {"round": np.asarray(rounds), "test_acc": np.asarray(acc, dtype=np.float64)})
    return (figures.acc_last_mean(run, window), figures.BY_NAME["best_acc"].compute(run), figures.rise_round(run))


def summarize(runs, target=None):
    """One row per run: its name, method label, algorithm and status (`_status`), then every figure of
    fedmpi.analysis.figures (NaN where the run has nothing to compute it from); with `target`, also the round
    and the bytes moved until the test accuracy first reached it."""
    return [{"run": run.name, "method": run.method,
             "algorithm": str(run.attrs.get("algorithm", algorithm_name(run.config))),
             "status": _status(run), **figures.compute(run, target),
             **_note(run)} for run in runs]


def _status(run):
    return run_status(run.attrs)


def run_status(attrs):
    """The run's status for a reader: run.h5's `status`, except that a run which went on past a non-finite model
    (`nonfinite_round` recorded) reads as diverged (fedmpi.analysis.selection groups by it)."""
    status = str(attrs.get("status", "?"))
    return "diverged" if status == "finished" and "nonfinite_round" in attrs else status


def _note(run):
    note = figures.epsilon_note(run)
    return {"epsilon_note": note} if note else {}


def _fmt(key, v):
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    unit = figures.UNITS.get(key)
    if unit == "share" or (unit is None and key.endswith(("acc", "_share"))):
        return f"{v:.4f}"
    if unit == "bytes":
        return human_bytes(v)
    if unit == "seconds":
        return f"{v:.1f}"
    if key == "emd":
        return f"{v:.3f}"
    if unit == "number":
        return f"{v:.4g}"
    return f"{v:.0f}"


def human_bytes(n):
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000


def _cell(row, key):
    """A formatted value; a column KEY with a KEY_std companion (sweeps) shows as "mean ± std"."""
    text = _fmt(key, row[key])
    spread = row.get(key + "_std")
    if spread is not None and not (isinstance(spread, float) and np.isnan(spread)) and text != "-":
        text += " ± " + _fmt(key, spread)
    return text


def latex_table(head, body, left):
    """A LaTeX (booktabs) tabular of the header `head` and the rows `body` (text cells), the first `left`
    columns left-aligned, the others right-aligned."""
    def esc(text):
        for plain, escaped in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"),
                               ("#", "\\#"), ("$", "\\$"), ("±", "$\\pm$")):
            text = text.replace(plain, escaped)
        return text

    lines = ["\\begin{tabular}{" + "l" * left + "r" * (len(head) - left) + "}", "\\toprule",
             " & ".join(esc(h) for h in head) + " \\\\", "\\midrule"]
    lines += [" & ".join(esc(c) for c in row) + " \\\\" for row in body]
    return "\n".join(lines + ["\\bottomrule", "\\end{tabular}"])


def format_table(rows, fmt="text", left=3):
    """Aligned plain text (`fmt="text"`, the first `left` columns left-aligned), a markdown table or a LaTeX
    (booktabs) tabular."""
    if not rows:
        return "(no runs)"
    keys = [k for k in rows[0] if not (k.endswith("_std") and k[:-4] in rows[0])]
    cells = [[_cell(r, k) for k in keys] for r in rows]
    if fmt == "latex":
        return latex_table(keys, cells, left)
    if fmt == "markdown":
        lines = [keys, [":--" if i < left else "--:" for i in range(len(keys))]] + cells
        return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines)
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.ljust(w) if i < left else v.rjust(w)  # noqa: E731
                                  for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(keys), line(["-" * w for w in widths])] + [line(c) for c in cells])


def write_csv(rows, path):
    """The table as CSV, through a temporary file renamed into place (a link at `path` is not followed)."""
    def write(fh):
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    replace_with(path, write, newline="")


def partition_summary(stats, title="clients"):
    samples = np.asarray(stats["samples"])
    labels = np.asarray(stats["labels"])
    classes_held = (labels > 0).sum(axis=1)
    return (f"{title}: {len(samples)}, samples per client min {samples.min()} / median "
            f"{int(np.median(samples))} / max {samples.max()}, classes per client min {classes_held.min()} / "
            f"max {classes_held.max()}, EMD mean {np.mean(stats['emd']):.3f} "
            f"(sample-weighted {mean_client_emd(stats):.3f})")


def server_summary(stats, server_cfg):
    """One line on the server's set (`/partition/server`)."""
    samples = int(np.asarray(stats["samples"]).sum())
    if samples == 0:
        return "server set: none (server_data.size = 0)"
    held = int((np.asarray(stats["labels"]) > 0).sum())
    return (f"server set: {samples} samples ({server_cfg.scheme}, {server_cfg.source}), {held} classes, "
            f"EMD {float(np.asarray(stats['emd'])[0]):.3f}")
