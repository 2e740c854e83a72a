"""The Python API over many run files, as pandas DataFrames: `runs` (one row per run), `rounds` (tidy per-round
figures: run, round, metric, value; per client or per class on request) and `summary` (mean, std, n and a 95%
confidence interval per group, over seeds). `fedmpi report`, `fedmpi export` and tools/ read runs through the same
reader (fedmpi.analysis.report.read_run) and the same figures (fedmpi.analysis.figures).

Rounds are 1-based here as everywhere a person reads them: /metrics/round stores 0 for the first round, and
`rounds()` adds 1. Files still being written are read up to their last complete round, one file at a time, when
the call reaches it; /clients is read only where a figure or `per="client"` needs it.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np

from fedmpi.analysis import figures as figs
from fedmpi.analysis import report, selection
from fedmpi.analysis.sources import sweep_sets

# Config keys that say how a run ran, not what it computed: a group that differs only in these is like with like.
RUN_ONLY_KEYS = ("out", "runtime.", "checkpoint.")
# The run file's attributes that describe the run (next to its config): column name -> attribute.
RUN_ATTRS = {"version": "fedmpi_version", "world_size": "world_size", "nodes": "nodes",
             "ranks_per_node": "ranks_per_node", "hosts": "hosts", "device": "device", "threads": "threads",
             "started": "started", "updated": "updated"}
# t quantiles q(0.975) of Student's t with 1..30 degrees of freedom (beyond: a Cornish-Fisher expansion)
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = 1.959963984540054


def _pandas():
    import pandas

    return pandas


# --- reading ----------------------------------------------------------------------------------------------

def _as_runs(source, err=None):
    """Runs from paths or globs (a str or a list), a DataFrame of `runs()` (its `path` column) or Run objects."""
    if hasattr(source, "columns") and "path" in source.columns:
        source = list(source["path"])
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    source = list(source)
    if all(isinstance(item, report.Run) for item in source):
        return source
    from fedmpi.analysis.sources import load_runs

    return load_runs([os.fspath(item) for item in source], err=err)


def flatten(config, prefix=""):
    """{dotted key: value} of a nested config; lists become tuples (so that a column can be grouped by)."""
    out = {}
    for key, value in (config or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        elif isinstance(value, list):
            out[name] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        else:
            out[name] = value if not isinstance(value, dict) else None
    return out


def unique_names(runs):
    """Each run's folder name, or parent/name where two runs share a folder name."""
    names = [run.name for run in runs]
    clash = {n for n in names if names.count(n) > 1}
    return [os.path.join(os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(run.path)))), run.name)
            if run.name in clash else run.name for run in runs]


def run_row(run, name=None, target=None):
    """One run as a row: its name, path, method, status and description, every figure, every config key."""
    row = {"run": name or run.name, "path": run.path, "method": run.method,
           "status": selection.run_status(run.attrs)}
    row.update(sweep_sets(run))
    for column, attr in RUN_ATTRS.items():
        value = run.attrs.get(attr)
        row[column] = value.item() if hasattr(value, "item") else value
    row.update(figs.compute(run, target))
    row["epsilon_note"] = figs.epsilon_note(run)
    row["nonfinite_round"] = _number(run.attrs.get("nonfinite_round"))
    row["evaluated_rounds"] = selection.evaluated_rounds(run)
    row.update({k: v for k, v in flatten(run.config).items() if k not in row})
    return row


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def runs(paths, target=None, err=None):
    """One row per run found in `paths` (files, run folders, folders of runs searched recursively, globs; or Run
    objects): `run`, `path`, `method` (fedmpi.analysis.labels), `status` (run.h5's; `diverged` for a run that
    went on past a non-finite model, whose `nonfinite_round` says from which round), `set` (the name of the
    sweep's set that made the run: fedmpi.analysis.sources.sweep_sets; None outside a sweep), the run file's
    description (`version`, `world_size`, `nodes`, `hosts`, ...), every summary figure of
    fedmpi.analysis.figures (NaN where the run has nothing to compute it from; with `target` also
    target_round and target_bytes), `epsilon_note` (why the model's epsilon is infinite, where a fork made it
    so; else None), `evaluated_rounds` (the 1-based rounds where the test accuracy was measured), and every
    config key flattened to a dotted column (`seed`, `algorithm.name`, `client.lr`, ...). A file that cannot
    be read is named on `err` (default stderr) and left out."""
    found = _as_runs(paths, err)
    pd = _pandas()
    df = pd.DataFrame([run_row(run, name, target) for run, name in zip(found, unique_names(found))])
    # What the rows were looked for in, so that a summary of none can say where no run was found.
    df.attrs["sources"] = _source_names(paths)
    df.attrs["target"] = target         # so that a summary taken at an earlier round computes the same figures
    return df


def _source_names(paths):
    if hasattr(paths, "columns"):
        return list(paths.attrs.get("sources", ()))
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    try:
        return [os.fspath(p) if isinstance(p, (str, os.PathLike)) else getattr(p, "path", repr(p)) for p in paths]
    except TypeError:
        return [repr(paths)]


def no_runs_error(df, what):
    """The error of a summary or table over a table without runs: names the paths or globs `runs()` looked in."""
    sources = list(getattr(df, "attrs", {}).get("sources", ()))
    where = f"in {', '.join(repr(s) for s in sources)}" if sources else "in the table given"
    return ValueError(f"{what}: no run was found {where} (no run.h5 matched; check the path or glob)")


def rounds(source, metrics=None, per=None, err=None):
    """Tidy per-round figures of the runs in `source` (paths or globs, a DataFrame of `runs()`, Run objects):

    per=None      columns run, round, metric, value: every per-round /metrics figure (a [round, k] one as
                  NAME/LABEL per column, e.g. class_acc/3; phase times as timing/PHASE/rankR);
    per="client"  columns run, round, client, metric, value: every /clients figure;
    per="class"   columns run, round, class, metric, value: class_acc per class.

    `round` is 1-based. Rounds where a figure was not measured (NaN) are left out. `metrics` keeps only
    the named figures (for per=None, a name keeps its NAME/LABEL columns too)."""
    if per not in (None, "client", "class"):
        raise ValueError(f"per = {per!r}: must be None, 'client' or 'class'")
    pd = _pandas()
    found = _as_runs(source, err)
    frames = [_tidy(run, name, metrics, per) for run, name in zip(found, unique_names(found))]
    columns = ["run", "round"] + ([per] if per else []) + ["metric", "value"]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def _keep(tag, metrics):
    return metrics is None or tag in metrics or tag.split("/")[0] in metrics


def _tidy(run, name, metrics, per):
    from fedmpi.analysis.export import scalar_series

    pd = _pandas()
    steps = np.asarray(run.metrics["round"], dtype=np.float64) + 1
    parts = []
    if per is None:
        for tag, values in scalar_series(run):
            if _keep(tag, metrics):
                keep = np.isfinite(values[:len(steps)])
                parts.append(pd.DataFrame({"round": steps[:len(values)][keep], "metric": tag,
                                           "value": values[:len(steps)][keep]}))
    else:
        if per == "client":
            table = {n: run.client_figure(n) for n in _client_names(run)}
        else:
            table = {"class_acc": run.metrics.get("class_acc")}
        for metric, values in table.items():
            if values is None or np.ndim(values) != 2 or not _keep(metric, metrics):
                continue
            values = np.asarray(values, dtype=np.float64)[:len(steps)]
            r, k = np.nonzero(np.isfinite(values))
            parts.append(pd.DataFrame({"round": steps[r], per: k, "metric": metric, "value": values[r, k]}))
    if not parts:
        return pd.DataFrame()
    frame = pd.concat(parts, ignore_index=True)
    frame.insert(0, "run", name)
    frame["round"] = frame["round"].astype(np.int64)
    return frame


def _client_names(run):
    from fedmpi.io.store import open_run

    try:
        with open_run(run.path) as f:
            return [n for n in f.get("clients", {}) if n != "ids"]
    except (OSError, KeyError, ValueError):
        return []


# --- summaries --------------------------------------------------------------------------------------------

def half_width(std, n, interval="ci95"):
    """The ± of a mean over `n` runs whose sample standard deviation is `std` (a number or an array): the 95%
    confidence interval's half-width (Student's t), `std` itself, or the standard error (`sem`); NaN for
    "none" or fewer than two runs. The tables' FIG_ci95, paper_table's cells and the figures' bands."""
    if interval == "none" or n < 2:
        return math.nan
    if interval == "std":
        return std
    return std / math.sqrt(n) * (t_quantile(n - 1) if interval == "ci95" else 1.0)


def t_quantile(dof):
    """q(0.975) of Student's t with `dof` degrees of freedom (a table to 30, then a Cornish-Fisher expansion)."""
    if dof < 1:
        return math.nan
    if dof <= len(_T975):
        return _T975[dof - 1]
    z, v = _Z975, float(dof)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * v ** 4))


def figure_columns(df):
    """The summary figures present in a `runs()` DataFrame with at least one measured value, in figures' order."""
    names = [f.name for f in figs.FIGURES + figs.TARGET_FIGURES]
    return [n for n in names if n in df.columns and _kept(n, df[n].to_numpy(dtype=np.float64)).any()]


def _kept(name, values):
    """Which values count as measured: finite ones, and an infinite epsilon (figures.UNBOUNDED)."""
    return ~np.isnan(values) if name in figs.UNBOUNDED else np.isfinite(values)


def config_columns(df):
    known = {"run", "path", "method", "status", "epsilon_note", "nonfinite_round", "evaluated_rounds", "set",
             *RUN_ATTRS, *figs.DEFINITIONS}
    return [c for c in df.columns if c not in known and not c.startswith(RUN_ONLY_KEYS + ("set.",))]


def differing(members, columns, over):
    out = []
    for column in columns:
        if column == over:
            continue
        values = {repr(v) for v in members[column]}
        if len(values) > 1:
            out.append(column)
    return out


def summary(df, by=("method",), over="seed", figures=None, warn=True, include=None, at_round=None):
    """One row per group of `df` (a `runs()` DataFrame) sharing the values of the columns `by`: the group's keys,
    `n` (its runs used), `left_out` (what the group left out by status, "+1 diverged, +2 running at rounds 4-6";
    "" for nothing), `round` (the 1-based round every group is compared at), `over` (the values of that column
    in the group, e.g. the seeds), `varies` (config keys other than `over` whose values differ within the group,
    empty when the group is like with like; a warning names them), then for every figure FIG: FIG_mean, FIG_std
    (sample, ddof 1), FIG_n (runs that measured it) and FIG_ci95 (half-width of the 95% confidence interval of
    the mean, Student's t: t(0.975, n-1) std / sqrt n; NaN for a single run).

    Only finished runs are used unless `include` names others ("diverged", "running", "failed", a list of them
    or "all"; fedmpi.analysis.selection). Every run is taken at the same round: `at_round`, or by default the
    last round that every run used evaluated; a run that went on past it has its figures computed from its
    rows up to that round (re-read from its file)."""
    pd = _pandas()
    if not len(df):
        raise no_runs_error(df, "summary")
    by = [by] if isinstance(by, str) else list(by)
    missing = [k for k in by + [over] if k not in df.columns]
    if missing:
        raise KeyError(f"no column {', '.join(missing)} in the runs' table: group by a config key as a dotted "
                       f"column ({', '.join(c for c in df.columns[:8])}, ...) or 'method'")
    names = list(figures) if figures is not None else figure_columns(df)
    columns = config_columns(df)
    sources = list(df.attrs.get("sources", ()))
    df, used, round_, how = _selected(df, include, at_round)
    rows = []
    groups = df.groupby(by, sort=True, dropna=False) if by else [((), df)]
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        members = group[used[group.index]]
        row = dict(zip(by, key))
        row["n"] = len(members)
        row["left_out"] = _left_out(group[~used[group.index]])
        row["round"] = round_
        row[over] = ",".join(str(v) for v in members[over])
        varies = differing(members, [c for c in columns if c not in by], over)
        row["varies"] = ",".join(varies)
        if varies and warn:
            warnings.warn(f"the group {dict(zip(by, key))} mixes runs that differ in {', '.join(varies)}: "
                          f"add them to by= (or group by 'method')", stacklevel=2)
        for name in names:
            values = members[name].to_numpy(dtype=np.float64)
            values = values[_kept(name, values)]
            n = len(values)
            with np.errstate(invalid="ignore"):         # the spread of infinite epsilons is NaN
                std = float(values.std(ddof=1)) if n > 1 else math.nan
            row[f"{name}_mean"] = float(values.mean()) if n else math.nan
            row[f"{name}_std"] = std
            row[f"{name}_n"] = n
            row[f"{name}_ci95"] = half_width(std, n)
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["sources"] = sources
    out.attrs["round"] = selection.note(round_, how)
    return out


def _statuses(df):
    return list(df["status"]) if "status" in df.columns else ["finished"] * len(df)


def _reached(df):
    return [int(v) if np.isfinite(v) else 0 for v in df["rounds_done"].to_numpy(dtype=np.float64)] \
        if "rounds_done" in df.columns else [0] * len(df)


def _left_out(rows):
    return selection.left_out_text([(selection.category(s), r) for s, r in zip(_statuses(rows), _reached(rows))])


def _selected(df, include, at_round):
    """(df with the used runs' figures at the comparison round, which rows are used, the round, how it was
    chosen): `summary`'s selection by status (fedmpi.analysis.selection) and its one round."""
    pd = _pandas()
    index, _ = selection.split(list(df.index), _statuses(df), _reached(df), include)
    used = pd.Series(df.index.isin(index), index=df.index)
    kept = df.loc[index]
    if "evaluated_rounds" in df.columns:
        evaluated = list(kept["evaluated_rounds"])
    else:       # a table made by hand: its rows are taken as they are
        evaluated = [()] * len(kept)
    round_, how = selection.comparison_round(evaluated, _reached(kept), list(kept.get("run", [""] * len(kept))),
                                             at_round)
    later = [i for i, reached in zip(index, _reached(kept)) if reached > round_ and "path" in df.columns]
    if later:
        df = df.copy()
        target = df.attrs.get("target")
        for i in later:
            run = selection.at_round_of(report.read_run(df.at[i, "path"]), round_)
            for name, value in figs.compute(run, target).items():
                if name in df.columns:
                    df.at[i, name] = value
    return df, used, round_, how


def table(summary_df, fmt="markdown", figures=None, digits=3):
    """The grouped summary as a table: one row per group (its keys; n with what the group left out,
    "2, +1 diverged"; the round its figures are taken at), one column per figure as "mean ± std" (`digits`
    decimals; a share in %, bytes in MB; each head says so). fmt: markdown, or latex (booktabs). Methods x
    settings with a confidence interval: fedmpi.analysis.paper_table."""
    if fmt not in ("markdown", "latex"):
        raise ValueError(f"fmt = {fmt!r}: must be markdown or latex")
    if not len(summary_df):
        raise no_runs_error(summary_df, "table")
    names = figures or [c[:-5] for c in summary_df.columns if c.endswith("_mean")]
    keys = [c for c in summary_df.columns if not c.endswith(("_mean", "_std", "_n", "_ci95"))
            and c not in ("varies", "left_out")]
    head = keys + [_heading(n) for n in names]
    body = [[_key_cell(row, k) for k in keys] + [_cell(row, n, digits) for n in names]
            for _, row in summary_df.iterrows()]
    if fmt == "markdown":
        lines = [head, [":--"] * len(keys) + ["--:"] * len(names)] + body
        return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines)
    return report.latex_table(head, body, len(keys))


def _key_cell(row, key):
    """A key's cell; n says what the group left out beside it ("2, +1 diverged")."""
    if key == "n" and row.get("left_out"):
        return f"{row['n']}, {row['left_out']}"
    return str(row[key])


def _heading(name):
    """The figure's column head, naming its unit and the statistic of its cells (fedmpi.analysis.paper_table
    prints a confidence interval instead)."""
    unit = {"share": "%", "bytes": "MB", "seconds": "s"}.get(figs.UNITS.get(name))
    return f"{name} ({unit + ', ' if unit else ''}mean ± std)"


def _cell(row, name, digits):
    mean, std = row.get(f"{name}_mean", math.nan), row.get(f"{name}_std", math.nan)
    if not np.isfinite(mean):
        return "-"
    scale = {"share": 100.0, "bytes": 1e-6}.get(figs.UNITS.get(name), 1.0)
    text = f"{mean * scale:.{digits}g}" if scale == 1.0 and abs(mean) >= 10 ** digits else f"{mean * scale:.{digits}f}"
    if np.isfinite(std):
        text += f" ± {std * scale:.{digits}f}"
    return text
