"""The names and shapes under which a run's figures leave fedmpi for other tools: one set of rules for the
after-the-fact export (`fedmpi export --tensorboard/--csv`, fedmpi.analysis.export) and for the live trackers
(`runtime.trackers`, fedmpi.run.tracking), so a figure has the same tag in both.

- a per-round number under /metrics by its name (`test_acc`, `bytes_up`, ...), its round as the step;
- a [round, k] figure as NAME/LABEL per column, LABEL its `layers` attribute (layer names) or the index;
- the phase times /timing/<phase> [round, rank] as `timing/PHASE/rankR`;
- a per-client figure /clients/<name> as the histogram `clients/NAME` of the clients measured that round.
Text figures (model_sha256) and values not measured (NaN) are left out.
"""

from __future__ import annotations

import numpy as np

from fedmpi.core.timing import PHASES
from fedmpi.io.client_rows import client_table
from fedmpi.io.store import CORE_METRICS, open_run

HISTOGRAM_BINS = 30
STEP = "round"          # the step of every series, not a series itself


def column_labels(attrs, columns):
    """Labels of the columns of a [round, k] figure whose dataset attributes are `attrs`: its `layers`
    attribute where there is one (layer names), otherwise the column index (classes of class_acc)."""
    names = (attrs or {}).get("layers")
    if names is not None and len(names) == columns:
        return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return [str(j) for j in range(columns)]


def column_tag(name, label):
    return f"{name}/{label}"


def timing_tag(phase, rank):
    return f"timing/{phase}/rank{rank}"


def client_tag(name):
    return f"clients/{name}"


def is_text(value):
    return isinstance(value, (str, bytes)) or np.asarray(value).dtype.kind in "SUO"


def ordered_names(names, ndim_of):
    """The export's stable order of /metrics names: the core figures, the other 1-D figures by name, then
    the [round, k] figures by name (`ndim_of(name)` tells which is which); the step and text are left out."""
    names = [n for n in names if n != STEP]
    one_d = [k for k in CORE_METRICS if k in names and ndim_of(k) == 1]
    one_d += sorted(k for k in names if k not in CORE_METRICS and ndim_of(k) == 1)
    return one_d, sorted(k for k in names if ndim_of(k) == 2)


def row_scalars(metrics, metric_attrs=None, timing=None):
    """[(tag, float)] of one round's row as the run loop appends it to run.h5 (fedmpi.io.store.RunLog.append:
    `metrics` name -> float, text or 1-D row; `timing` [rank, phase] seconds), in the export's order and
    with its tags; text and NaN are left out."""
    numbers = {k: v for k, v in metrics.items() if v is not None and not is_text(v)}
    one_d, two_d = ordered_names(numbers, lambda k: np.ndim(numbers[k]) + 1)
    out = [(k, float(numbers[k])) for k in one_d]
    for name in two_d:
        values = np.asarray(numbers[name], dtype=np.float64)
        labels = column_labels((metric_attrs or {}).get(name), len(values))
        out += [(column_tag(name, label), float(v)) for label, v in zip(labels, values)]
    if timing is not None:
        timing = np.asarray(timing, dtype=np.float64)
        for i, phase in sorted(enumerate(PHASES), key=lambda p: p[1]):
            out += [(timing_tag(phase, r), float(timing[r, i])) for r in range(timing.shape[0])]
    return [(tag, v) for tag, v in out if np.isfinite(v)]


def row_clients(clients):
    """{tag: finite values} of one round's per-client figures (name -> [num_clients] row), by name; a
    figure no client measured this round is left out."""
    out = {}
    for name in sorted(clients or {}):
        row = np.asarray(clients[name], dtype=np.float64)
        row = row[np.isfinite(row)]
        if len(row):
            out[client_tag(name)] = row
    return out


def histogram(values, bins=HISTOGRAM_BINS):
    """TensorBoard's histogram of finite `values` as (min, max, num, sum, sum_squares, limits, counts).
    TensorBoard's bucket i holds the values in (limits[i-1], limits[i]] (numpy's bins are closed on the
    other side), so the counts are taken with that rule: the minimum alone fills the first bucket."""
    limits = np.histogram_bin_edges(values, bins=min(bins, max(1, len(np.unique(values)))))
    counts = np.bincount(np.searchsorted(limits, values, side="left"), minlength=len(limits))
    return (float(values.min()), float(values.max()), float(len(values)), float(values.sum()),
            float(np.square(values).sum()), [float(x) for x in limits], [float(c) for c in counts])


def quantiles(values, levels=(0.0, 0.25, 0.5, 0.75, 1.0)):
    """{suffix: value} summary of finite `values` for trackers without histograms (MLflow): min, quartiles,
    max and mean, as `TAG/min`, `TAG/q25`, ... ."""
    names = {0.0: "min", 0.25: "q25", 0.5: "median", 0.75: "q75", 1.0: "max"}
    out = {names.get(q, f"q{round(q * 100)}"): float(v) for q, v in zip(levels, np.quantile(values, levels))}
    out["mean"] = float(np.mean(values))
    return out


def flat_params(mapping, prefix=""):
    """{dotted key: value} of a nested config mapping (Config.to_dict()); lists become their text."""
    out = {}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def stored_rows(path, rows):
    """The first `rows` rows of the run file at `path` as the run loop appended them: (metric_attrs, [(step,
    metrics, clients, timing)]), for trackers that join a run whose earlier rows are already in run.h5 (a
    fork's rows copied from its parent)."""
    with open_run(path) as f:
        group = f["metrics"]
        attrs = {name: dict(ds.attrs) for name, ds in group.items()}
        columns = {name: ds[:rows] for name, ds in group.items()}
        table = client_table(f, rows)
        timing = {phase: f["timing"][phase][:rows] for phase in PHASES if "timing" in f and phase in f["timing"]}
    out = []
    for i in range(min(rows, len(columns.get(STEP, ())))):
        metrics = {name: values[i] for name, values in columns.items()}
        clients = {name: table.row(name, i) for name in table.names if i < table.length(name)}
        ranks = max((v.shape[1] for v in timing.values()), default=0)
        row_timing = None
        if timing:
            row_timing = np.stack([timing[p][i] if p in timing else np.full(ranks, np.nan) for p in PHASES], axis=1)
        out.append((int(metrics[STEP]), metrics, clients, row_timing))
    return attrs, out
