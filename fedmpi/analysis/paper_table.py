"""A paper's table: one figure of a grouped summary as a pivot, methods x settings, each cell "mean ± interval".

    t = a.paper_table(df, rows="method", cols="partition.beta", metric="final_acc")   # df: a.runs(...)
    print(t.latex())        # booktabs, the statistic and n in the caption; t.markdown(); t.csv("table.csv")

Built over `fedmpi.analysis.summary` (grouped by the row and column keys, over the seeds): the cell's mean is
FIG_mean, its interval the half-width of the named statistic: `ci95` (95% confidence interval of the mean,
Student's t: t(0.975, n - 1) std / sqrt(n), FIG_ci95), `std` (sample standard deviation, n - 1), `sem`
(standard error, std / sqrt(n)) or `none`. The caption says which, over how many runs, and at which round
where the summary says (its `round` column); a cell whose n or round differs from the caption's, that left
runs out (the summary's `left_out` column, e.g. "+1 diverged"), that has one run (no interval) or mixes runs
that differ in other config keys (`varies`) gets a mark and a note naming it. `fedmpi report --table ROWS x
COLS` prints the same table.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from fedmpi.analysis import figures as figs
from fedmpi.core.errors import InputError
from fedmpi.core.output_paths import replace_with

# interval name -> how the caption names it
INTERVALS = {"ci95": "95% CI (Student's t)", "std": "std (sample, n - 1)", "sem": "s.e.m. (std / sqrt n)",
             "none": None}
# Readable names of keys a table is often pivoted by (a key not here is shown as itself).
KEY_TITLES = {"method": "Method", "set": "Set", "partition.beta": "Dirichlet β", "partition.scheme": "Partition",
              "partition.clients": "Clients", "server.clients_per_round": "Clients per round",
              "client.lr": "Client lr", "client.epochs": "Local epochs", "client.steps": "Local steps",
              "algorithm.name": "Algorithm", "algorithm.mu": "FedProx μ", "algorithm.gamma": "γ", "seed": "Seed",
              "attack.name": "Attack", "server.aggregator": "Aggregator", "privacy.noise_multiplier": "Noise σ"}
# Readable names of the figures a table often shows (a caption's first words; others are shown as their name).
METRIC_TITLES = {"final_acc": "Final test accuracy", "acc_last20_mean": "Mean test accuracy of the last 20 "
                 "evaluations", "best_acc": "Best test accuracy", "local_acc_mean": "Local accuracy",
                 "rise_round": "Rise round", "target_round": "Rounds to target", "bytes_moved": "Bytes moved",
                 "wall_s": "Wall time", "backdoor_acc": "Backdoor success", "test_acc_tail10": "Main-task accuracy",
                 "epsilon": "ε", "final_perplexity": "Final test perplexity",
                 "best_perplexity": "Best (lowest) test perplexity", "local_perplexity_mean": "Local perplexity"}
MISSING = {"markdown": "–", "latex": "--", "csv": ""}
# One pass, character by character (a replacement's own braces and backslashes are never escaped again).
_LATEX = str.maketrans({"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "_": "\\_", "#": "\\#", "$": "\\$",
                        "{": "\\{", "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}",
                        "±": "$\\pm$", "–": "--", "β": "$\\beta$", "μ": "$\\mu$", "γ": "$\\gamma$",
                        "σ": "$\\sigma$", "ε": "$\\varepsilon$"})


@dataclass
class Cell:
    mean: float
    half: float         # the interval's half-width (NaN: none, or one run)
    n: int
    text: str           # "77.2 ± 1.3" in the table's digits and scale
    remarks: list = field(default_factory=list)     # what the cell's note says
    mark: str = ""      # the note's letter
    best: bool = False


@dataclass
class PaperTable:
    """The table: `row_labels` x `col_labels`, `cells[(row, col)]` (a Cell, or absent where no run was found),
    the `caption` and the `notes` (one per marked cell). `.markdown()`, `.latex()`, `.csv(path)` write it;
    `.frame()` gives its numbers (unscaled) as a DataFrame."""

    rows: list
    cols: list
    row_keys: list
    col_keys: list
    row_labels: list
    col_labels: list
    row_title: str
    cells: dict
    caption: str
    notes: list
    interval: str
    metric: str

    def __str__(self):
        return self.markdown()

    def _cell(self, r, c, fmt):
        cell = self.cells.get((r, c))
        if cell is None:
            return MISSING[fmt]
        text = cell.text
        if cell.best and fmt != "csv":
            text = f"**{text}**" if fmt == "markdown" else "\\textbf{" + _latex(text) + "}"
        elif fmt == "latex":
            text = _latex(text)
        if cell.mark:
            text += {"markdown": f"<sup>{cell.mark}</sup>", "latex": "\\textsuperscript{" + cell.mark + "}",
                     "csv": f" ({cell.mark})"}[fmt]
        return text

    def _body(self, fmt):
        return [[label] + [self._cell(r, c, fmt) for c in self.cols] for r, label in zip(self.rows, self.row_labels)]

    def markdown(self):
        """A Markdown table, the caption and the notes below it in italics."""
        lines = [[self.row_title] + self.col_labels, [":--"] + ["--:"] * len(self.cols)] + self._body("markdown")
        out = ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines]
        return "\n".join(out + ["", f"*{self.caption}*"] + [f"*{note}*" for note in self.notes])

    def latex(self, label=None, placement="t"):
        """A LaTeX table float: booktabs tabular, the caption (statistic, n, round) and the notes under the
        rule; `label` adds \\label{...}."""
        head = [_latex(self.row_title)] + [_latex(c) for c in self.col_labels]
        lines = ["\\begin{table}[" + placement + "]", "\\centering",
                 "\\caption{" + _latex(self.caption) + "}"] + (["\\label{" + label + "}"] if label else [])
        lines += ["\\begin{tabular}{l" + "r" * len(self.cols) + "}", "\\toprule", " & ".join(head) + " \\\\",
                  "\\midrule"]
        lines += [" & ".join([_latex(row[0])] + row[1:]) + " \\\\" for row in self._body("latex")]
        lines += ["\\bottomrule", "\\end{tabular}"]
        if self.notes:
            lines += ["\\par\\smallskip{\\footnotesize " + " \\\\ ".join(_latex(n) for n in self.notes) + "}"]
        return "\n".join(lines + ["\\end{table}"])

    def csv(self, path=None, numbers=False):
        """The table as CSV text (the cells as shown, the caption in the first column of the last rows), or
        with `numbers` the rows of `frame()`; written to `path` when given (replaced whole), else returned."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        if numbers:
            frame = self.frame()
            writer.writerow(list(frame.columns))
            writer.writerows(frame.itertuples(index=False))
        else:
            writer.writerow([self.row_title] + self.col_labels)
            writer.writerows(self._body("csv"))
            writer.writerows([[self.caption]] + [[note] for note in self.notes])
        if path is None:
            return buf.getvalue()
        replace_with(path, lambda fh: fh.write(buf.getvalue()), newline="", encoding="utf-8")
        return path

    def frame(self):
        """One row per cell shown, in the table's order: the row and column keys, mean, the interval's
        half-width (`interval`), low, high, n and the note, in the figure's own unit (a share as a fraction)."""
        import pandas

        out = []
        for r, c in ((r, c) for r in self.rows for c in self.cols if (r, c) in self.cells):
            cell = self.cells[(r, c)]
            out.append({**dict(zip(self.row_keys, r)), **dict(zip(self.col_keys, c)), "metric": self.metric,
                        "mean": cell.mean, "interval": self.interval, "half_width": cell.half,
                        "low": cell.mean - cell.half, "high": cell.mean + cell.half, "n": cell.n,
                        "note": "; ".join(cell.remarks)})
        return pandas.DataFrame(out)


MAX_DIGITS = 12        # decimals of a cell: beyond float64's 15-17 significant digits nothing is left to show

def paper_table(data, rows="method", cols=None, metric="final_acc", interval="ci95", digits=None, percent=None,
                row_order=None, col_order=None, row_names=None, col_names=None, row_title=None, metric_title=None,
                over="seed", best=None, include=None, at_round=None) -> PaperTable:
    """The table of `metric` with one row per value of `rows` and one column per value of `cols` (each a
    column name, e.g. "method", "set", a dotted config key, or a list of them; `cols=None`: one column).

    data      a `runs()` DataFrame (grouped here by `summary(data, by=rows + cols, over=over)`) or a
              `summary()` DataFrame grouped by (at least) those keys
    interval  ci95 (default), std, sem or none: the "± x" of each cell, named in the caption
    digits    decimals (default 1 for a percentage or MB, else 3); percent: a share as % (default: for
              shares, e.g. accuracy 0.7723 -> 77.2)
    row_order, col_order  the values to show, in order (default: numbers ascending, other values in the
              order of the data); a value not in the data is refused
    row_names, col_names  {value: display name}; by default a method's label (fedmpi.analysis.labels) as
              it is and a setting as "TITLE = value" (e.g. "Dirichlet β = 0.1", KEY_TITLES)
    row_title the header over the row labels (default the key's title, e.g. "Method")
    best      "max" or "min": that cell of each column (by the shown mean) in bold; "better": the figure's
              better end (fedmpi.analysis.figures.better: min for a loss or perplexity, max for an accuracy)
    include, at_round  as for `summary` (a runs() table only): finished runs unless `include` names others,
              every cell at one round (the last every run evaluated, or `at_round`); the notes say which"""
    row_keys, col_keys = _keys(rows), _keys(cols)
    if interval not in INTERVALS:
        raise InputError(f"interval = {interval!r}: must be one of {', '.join(INTERVALS)}")
    if best not in (None, "max", "min", "better"):
        raise InputError(f"best = {best!r}: must be max, min, better or None")
    best = figs.better(metric) if best == "better" else best
    summary = _summary(data, row_keys + col_keys, metric, over, include, at_round)
    unit = figs.UNITS.get(metric)
    if percent and unit != "share":     # 100 x a loss or a byte count is no percentage
        raise InputError(f"percent: {metric} is not a share of 1 (its unit: {unit or 'none'}); only a share, such "
                         f"as an accuracy, can be shown as a percentage")
    percent = unit == "share" if percent is None else bool(percent)
    scale, suffix = (100.0, " (%)") if percent else {"bytes": (1e-6, " (MB)"), "seconds": (1.0, " (s)")}.get(
        unit, (1.0, ""))
    if digits is not None and not (isinstance(digits, (int, np.integer)) and 0 <= digits <= MAX_DIGITS):
        raise InputError(f"digits = {digits!r}: must be a whole number from 0 to {MAX_DIGITS}")
    digits = (1 if scale != 1.0 else 3) if digits is None else int(digits)
    found = {}
    for _, row in summary.iterrows():
        key = tuple(_plain(row[k]) for k in row_keys + col_keys)
        if key in found:        # a summary grouped by more keys than the pivot's: one cell would hide another
            where = ", ".join(f"{k}={v}" for k, v in zip(row_keys + col_keys, key))
            raise InputError(f"the summary has several rows for {where}: it is grouped by more keys than rows "
                             f"and cols; pivot by those keys too, or give paper_table the runs() table")
        found[key] = row
    row_values = _ordered([k[:len(row_keys)] for k in found], row_order, row_keys, "row_order")
    col_values = _ordered([k[len(row_keys):] for k in found], col_order, col_keys, "col_order")
    cells = {}
    for key, row in found.items():
        r, c = key[:len(row_keys)], key[len(row_keys):]
        mean = float(row.get(f"{metric}_mean", math.nan))
        if not np.isfinite(mean):
            continue
        n = int(row.get(f"{metric}_n", row.get("n", 0)))
        half = _half(row, metric, interval, n)
        text = f"{mean * scale:.{digits}f}" + (f" ± {half * scale:.{digits}f}" if np.isfinite(half) else "")
        cells[(r, c)] = Cell(mean, half, n, text)
        cells[(r, c)].remarks = _remarks(row, n, interval, half)
    if best:
        _mark_best(cells, row_values, col_values, best, scale, digits)
    shown = [cells[(r, c)] for r in row_values for c in col_values if (r, c) in cells]
    if not shown:
        raise InputError(f"metric = {metric!r}: no run of this table measured it")
    # the caption's n: the most common among the cells shown (a tie: the larger), the others marked
    n_common = max(Counter(cell.n for cell in shown).items(), key=lambda kv: (kv[1], kv[0]))[0] if shown else 0
    rounds = {(r, c): _int(found[r + c].get("round")) for r in row_values for c in col_values if (r, c) in cells}
    round_common = Counter(v for v in rounds.values() if v is not None).most_common(1)
    round_common = round_common[0][0] if round_common else None
    row_labels = [_label(v, row_keys, row_names, with_title=False) for v in row_values]
    col_labels = [_label(v, col_keys, col_names, with_title=True) for v in col_values] if col_keys else \
        [_title(metric_title or METRIC_TITLES.get(metric, metric)) + suffix]
    notes = _notes(cells, row_values, col_values, row_labels, col_labels, n_common, rounds, round_common)
    caption = _caption(metric_title or METRIC_TITLES.get(metric, metric), suffix, interval, n_common,
                       [c.n for c in shown], over, round_common)
    title = row_title if row_title is not None else " / ".join(_key_title(k) for k in row_keys)
    return PaperTable(row_values, col_values, row_keys, col_keys, row_labels, col_labels, title, cells, caption,
                      notes, interval, metric)


def parse_pivot(text):
    """(row keys, column keys) of `fedmpi report --table`'s "ROWS x COLS" (each part one key or several
    joined by commas; "ROWS" alone: one column). `text` is a string or the list of its words."""
    words = " ".join(text if isinstance(text, (list, tuple)) else [text]).split()
    if words.count("x") > 1 or not words or words[0] == "x" or words[-1] == "x":
        raise InputError(f"--table {' '.join(words)!r}: give ROWS x COLS, e.g. --table method x partition.beta "
                         f"(or ROWS alone)")
    cut = words.index("x") if "x" in words else len(words)
    split = lambda part: [k for w in part for k in w.split(",") if k]     # noqa: E731
    return split(words[:cut]), split(words[cut + 1:])


# --- the parts ------------------------------------------------------------------------------------------

def _keys(keys):
    if keys is None:
        return []
    return [keys] if isinstance(keys, str) else list(keys)


def _summary(data, by, metric, over, include, at_round):
    from fedmpi.analysis import frames

    if not len(data):
        raise frames.no_runs_error(data, "paper_table")
    if f"{metric}_mean" in data.columns:        # a summary already
        missing = [k for k in by if k not in data.columns]
        if missing:
            raise InputError(f"the summary has no column {', '.join(missing)}: group it by "
                             f"{', '.join(by)} (summary(df, by=[...])) or give paper_table the runs() table")
        return data
    missing = [k for k in by + [over] if k not in data.columns]
    if missing:
        raise InputError(f"no column {', '.join(missing)} in the runs' table: pivot by `method`, `set` or a "
                         f"dotted config key (e.g. partition.beta, algorithm.name)")
    if metric not in data.columns:
        present = ", ".join(frames.figure_columns(data)[:12])
        raise InputError(f"metric = {metric!r}: not a figure of these runs (present: {present})")
    return frames.summary(data, by=by, over=over, figures=[metric], warn=False, include=include, at_round=at_round)


def _plain(value):
    """A grouping value as a plain Python value (numpy scalars as int/float, NaN/None as None)."""
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def _int(value):
    value = _plain(value)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sort_key(values):
    return [(0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))
            for v in values]


def _ordered(found, order, keys, option):
    """The values to show: `order` (each checked against the data) or the data's own (numbers ascending,
    other values in the order they came)."""
    present = list(dict.fromkeys(found))
    if order is None:
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for key in present for v in key)
        return sorted(present, key=_sort_key) if numeric else present
    wanted = [tuple(v) if isinstance(v, (tuple, list)) else (v,) for v in order]
    absent = [w for w in wanted if w not in present]
    if absent:
        shown = ", ".join(_show(v) for v in present)
        raise InputError(f"{option}: {', '.join(_show(v) for v in absent)} is not a value of "
                         f"{', '.join(keys) or 'the table'} here (present: {shown})")
    return wanted


def _show(value):
    return ", ".join(str(v) for v in value) if isinstance(value, tuple) else str(value)


def _half(row, metric, interval, n):
    from fedmpi.analysis.frames import half_width

    ci = row.get(f"{metric}_ci95")
    if interval == "ci95" and n >= 2 and ci is not None and np.isfinite(ci):
        return float(ci)        # the summary's own, where it carries one
    return half_width(float(row.get(f"{metric}_std", math.nan)), n, interval)


def _remarks(row, n, interval, half):
    remarks = []
    left_out = str(row.get("left_out") or "")
    if left_out and left_out != "nan":
        remarks.append(f"n={n} ({left_out} left out)")
    if n == 1 and interval != "none":
        remarks.append("one run: no interval")
    varies = str(row.get("varies") or "")
    if varies and varies != "nan":
        remarks.append(f"mixes runs that differ in {varies}")
    return remarks


def _mark_best(cells, row_values, col_values, best, scale, digits):
    for c in col_values:
        column = [cells[(r, c)] for r in row_values if (r, c) in cells]
        if column:
            shown = [round(cell.mean * scale, digits) for cell in column]
            target = max(shown) if best == "max" else min(shown)
            for cell, value in zip(column, shown):
                cell.best = value == target


def _notes(cells, row_values, col_values, row_labels, col_labels, n_common, rounds, round_common):
    """One note per cell that differs from the caption: its letter on the cell, its remarks in the note."""
    notes, letters = [], iter("abcdefghijklmnopqrstuvwxyz")
    for r, row_label in zip(row_values, row_labels):
        for c, col_label in zip(col_values, col_labels):
            cell = cells.get((r, c))
            if cell is None:
                continue
            if cell.n != n_common and not any(x.startswith("n=") for x in cell.remarks):
                cell.remarks.insert(0, f"n={cell.n}")
            if rounds.get((r, c)) is not None and rounds[(r, c)] != round_common:
                cell.remarks.append(f"at round {rounds[(r, c)]}")
            if cell.remarks:
                cell.mark = next(letters, "*")
                where = row_label + (f", {col_label}" if len(col_values) > 1 else "")
                notes.append(f"{cell.mark}: {where}: {'; '.join(cell.remarks)}")
    return notes


def _caption(metric_title, suffix, interval, n_common, ns, over, round_common):
    what = "seeds" if over == "seed" else "runs"
    counts = f"n={n_common} {what}" if len(set(ns)) <= 1 else f"n={n_common} {what} (n={min(ns)}–{max(ns)}; " \
                                                            f"cells marked where it differs)"
    statistic = f"mean ± {INTERVALS[interval]}" if INTERVALS[interval] else "mean"
    at = f" at round {round_common}" if round_common is not None else ""
    return f"{_title(metric_title)}{suffix}{at}: {statistic} over {counts}."


def _title(text):
    return text[:1].upper() + text[1:]


def _key_title(key):
    return KEY_TITLES.get(key, key)


def _value(value):
    return f"{value:g}" if isinstance(value, float) else str(value)


def _label(values, keys, names, with_title):
    names = names or {}
    for candidate in (values, values[0] if len(values) == 1 else None):
        if candidate is not None and candidate in names:
            return str(names[candidate])
    if not with_title or keys == ["method"] or keys == ["set"]:
        return ", ".join(_value(v) for v in values)
    return ", ".join(f"{_key_title(k)} = {_value(v)}" for k, v in zip(keys, values))


def _latex(text):
    return text.translate(_LATEX)
