"""`fedmpi report` (and tools/compare.py, tools/sweep.py): a thin layer over fedmpi.analysis.

The table: one row per run (or, with --by, per group: mean ± std over its runs) of the core figures, then one
section per family that some run recorded (personalization, fairness, robustness, privacy, secure aggregation,
deployment), every figure defined in fedmpi.analysis.figures, and where some runs are counterfactuals of an
original, the clients' leave-one-out contributions (fedmpi.analysis.contribution_table). --csv writes one row
per run (or group) with every figure of every family present, and each requested view (--classes, --clients,
--attack, --timing) as FILE-VIEW.csv beside it. --plot writes one figure for all the runs
(fedmpi.analysis.overview); --per-run adds each run's own figure beside it (FILE-RUN.png), --clients the
local-accuracy CDFs, --timing the phase bars, and a leave-one-out study its contributions
(FILE-contributions.png).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from fedmpi.analysis import figure_style, figures, frames, report, selection
from fedmpi.analysis.attack_report import attack_rows, attack_section
from fedmpi.analysis.class_report import class_rows, class_section
from fedmpi.analysis.client_report import client_row, client_section, plot_clients
from fedmpi.analysis.contribution_table import contribution_figure_tags, contribution_section, plot_study
from fedmpi.analysis.curves import missing_curves
from fedmpi.analysis.overview import plot_overview
from fedmpi.analysis.paper_table import paper_table, parse_pivot
from fedmpi.analysis.run_figure import plot_run
from fedmpi.analysis.sources import find_run_files, load_runs
from fedmpi.analysis.sweeps import sweep_rows
from fedmpi.analysis.timing_report import plot_timing, timing_rows, timing_section
from fedmpi.core.errors import EXIT_FAILED, EXIT_USAGE, InputError
from fedmpi.core.output_paths import check_distinct, check_figure, check_file, sibling

CORE = ("run", "method", "status", "rounds_done", "emd", "final_acc", "acc_last20_mean", "best_acc", "rise_round",
        "final_perplexity", "best_perplexity", "target_round", "target_bytes", "uploads", "bytes_moved", "wall_s")
VIEWS = ("classes", "clients", "attack", "timing")


def report_command(paths, target=None, by=(), csv_path=None, plot=None, x="round", fmt="text", out=None,
                   err=None, classes=False, timing=False, clients=False, attack=False, force=False,
                   per_run=False, include=None, at_round=None, table=None, metric="final_acc", interval="ci95",
                   digits=None, percent=None, plot_width=None) -> int:
    """Prints the table of the runs in `paths` to `out` (grouped by the keys `by` when given) with a section per
    family present, optionally the views, writes the CSVs and draws the figures; returns the exit status. With
    `table` ("ROWS x COLS") the table is instead the paper table of `metric` (fedmpi.analysis.paper_table: mean ±
    `interval` per cell, Markdown or LaTeX; --csv writes it as CSV). A path
    that names no run, or a file that cannot be read, is skipped with a warning (exit 2 only where no run is
    left); a place that cannot be written, or an existing file there without `force`, is exit 2 before anything
    is read or written. Grouped rows and the figure use the finished runs unless `include` names others
    (fedmpi.analysis.selection; each group says what it left out), every group taken at one round (`at_round`,
    or the last round every run used evaluated; a note says which)."""
    out, err = out or sys.stdout, err or sys.stderr
    views = {"classes": classes, "clients": clients, "attack": attack, "timing": timing}
    files, unmatched = find_run_files(paths)        # names only: nothing is read before the places are checked
    try:
        selection.included(include)
        if at_round is not None:
            selection.comparison_round([], [], at_round=at_round)
        pivot = _pivot(table, by)
        figure_style.check_band(interval)
        figure_style.check_width(plot_width, "--plot-width")
        # `report RUN/run.h5 --csv RUN/run.h5` keeps the run, --force or not
        if csv_path is not None:
            for path in csv_paths(csv_path, views).values():
                check_file(path, "--csv", inputs=files, replace=force)
        if plot is not None:
            check_figure(plot, "--plot", inputs=files, replace=force)
        check_distinct(_outputs(csv_path, views, [plot] if plot is not None else []))
    except InputError as e:
        print(f"fedmpi: error: {e}", file=err)
        return EXIT_USAGE
    for path in unmatched:
        print(f"fedmpi: warning: skipping {path}: no run file there (a run.h5, a run folder or a folder of runs)",
              file=err)
    runs = load_runs(files, err=err)
    if not runs:
        print("fedmpi: error: none of the run files could be read", file=err)
        return EXIT_USAGE
    if plot is not None:
        try:
            figures_drawn = figure_paths(runs, by, plot, timing, clients, per_run)
            for path in figures_drawn[1:]:
                check_file(path, "--plot", inputs=files, replace=force)     # the figures beside PLOT too
            check_distinct(_outputs(csv_path, views, figures_drawn))
        except InputError as e:
            print(f"fedmpi: error: {e} (a figure --plot writes beside {plot})", file=err)
            return EXIT_USAGE
    notes = []
    try:
        if pivot:
            try:
                printed = paper_table(frames.runs(runs, target), *pivot, metric=metric, interval=interval,
                                      digits=digits, percent=percent, include=include, at_round=at_round)
            except InputError as e:
                print(f"fedmpi: error: --table: {e}", file=err)
                return EXIT_USAGE
        elif by:
            # the grouped cells' statistic, said where they are printed (the paper table's caption says its own)
            notes.append(STD_NOTE)
            rows = sweep_rows(runs, by, target, notes, include, at_round)
        else:       # one row per run, each at its own last round or every one at --at-round
            if at_round is not None:
                selection.runs_round(runs, at_round)
                notes.append(selection.note(at_round, "the round asked for").replace("every group", "every run"))
            rows = report.summarize([selection.at_round_of(run, at_round) for run in runs] if at_round else runs,
                                    target)
    except selection.SelectionError as e:       # --at-round past the rounds of a run
        print(f"fedmpi: error: {e}", file=err)
        return EXIT_USAGE
    if pivot:
        print(printed.latex() if fmt == "latex" else printed.markdown(), file=out)
    else:
        print(tables(rows, by, fmt), file=out)
    # an infinite epsilon says why in the run file; the report says it too
    notes += [f"{run.name}: {note}" for run in runs if (note := figures.epsilon_note(run))]
    next_token = [run.name for run in runs if "test_perplexity" in run.metrics]
    if next_token:
        notes.append(f"{', '.join(next_token)}: a next-token task: its accuracies are token accuracies, its "
                     f"perplexity exp(mean test cross-entropy), where lower is better")
    for note in notes:
        print(("% " if fmt == "latex" else "") + f"note: {note}", file=out)
    for wanted, section in ((classes, class_section), (timing, timing_section)):
        for run in runs if wanted else ():
            print("\n" + section(run, fmt), file=out)
    if clients:
        print("\n" + client_section(runs, fmt), file=out)
    if attack:
        print("\n" + attack_section(runs, fmt), file=out)
    if (section := contribution_section(runs, fmt, include, at_round)) is not None:
        print("\n" + section, file=out)
    try:
        if csv_path is not None and pivot:
            printed.csv(csv_path)
        elif csv_path is not None:
            report.write_csv(csv_rows(rows, by), csv_path)
            for view, path in list(csv_paths(csv_path, views).items())[1:]:
                report.write_csv(view_rows(view, runs) or [{"run": "(none recorded)"}], path)
        if plot is not None:
            _draw(runs, by, plot, x, timing, out, err, clients, per_run, include, interval, plot_width, at_round)
    except OSError as e:
        # The places were checked: this is the disk failing while writing (full, I/O error).
        print(f"fedmpi: error: cannot write {e.filename or csv_path or plot}: {e.strerror or e}", file=err)
        return EXIT_FAILED
    return 0


# --- tables -----------------------------------------------------------------------------------------------

STD_NOTE = ("each grouped cell is mean ± std (sample standard deviation, n - 1) over the group's runs; "
            "--table ROWS x COLS prints mean ± 95% CI")


def _pivot(table, by):
    """(row keys, column keys) of --table, or None without it; InputError where it is malformed or given
    with --by (the table groups by its own keys)."""
    if table is None:
        return None
    if by:
        raise InputError("--table and --by: give one (--table ROWS x COLS groups by its own keys)")
    return parse_pivot(table)


def _measured(rows, name):
    """Some row measured it: NaN is "not recorded"; an infinite value (an unbounded epsilon) is a measurement."""
    return any(isinstance(r.get(name), (int, float)) and not np.isnan(r[name]) for r in rows)


def present(rows, names):
    """`names` that some row holds a measured value of (a figure no run recorded is no column)."""
    return [n for n in names if any(n in r for r in rows) and (n in ("run", "method", "status") or _measured(rows, n))]


def _pick(row, keys):
    """The row's `keys`, each with its KEY_std companion where a grouped row has one (shown as mean ± std)."""
    return {c: row.get(c) for k in keys for c in (k, k + "_std") if c == k or c in row}


def tables(rows, by=(), fmt="text"):
    """The core table, then one section per family with a measured figure (each with the rows' keys)."""
    # a grouped table's left_out column is there where some group left a run out (the CSV always has it)
    left_out = [] if not any(r.get("left_out") for r in rows) else ["left_out"]
    keys = list(by) + ["n", *left_out, "seeds", "reached"] if by else ["run", "method", "status"]
    core = [k for k in keys if k in rows[0]] + present(rows, [c for c in CORE if c not in keys])
    left = len(by) + 1 + len(left_out) if by else 3
    blocks = [report.format_table([_pick(r, core) for r in rows], fmt, left=left)]
    head = list(by) if by else ["run", "method"]
    for family in figures.FAMILIES[2:]:
        names = present(rows, [f.name for f in figures.FIGURES if f.family == family])
        if names:
            members = [r for r in rows if any(_measured([r], n) for n in names)]
            table = report.format_table([_pick(r, head + names) for r in members], fmt, left=len(head))
            blocks.append(("% " if fmt == "latex" else "") + f"{family}:\n" + table)
    return "\n\n".join(blocks)


def csv_rows(rows, by=()):
    """The CSV's rows: every column of the table and every family's figures that some row measured (a
    grouped row's FIGURE_std beside each FIGURE)."""
    names = present(rows, [f.name for f in figures.FIGURES + figures.TARGET_FIGURES])
    keys = [k for k in rows[0] if k not in figures.DEFINITIONS and not k.endswith("_std") and k != "epsilon_note"]
    keys += ["epsilon_note"] if any("epsilon_note" in r for r in rows) else []
    columns = keys + [c for n in names for c in ((n, n + "_std") if by else (n,))]
    return [{c: _csv_value(c, r.get(c, np.nan)) for c in columns} for r in rows]


def _csv_value(column, value):
    """Counts and rounds of a run as integers (29, not 29.0), a figure not measured as an empty cell."""
    if isinstance(value, float) and math.isnan(value):
        return ""
    if figures.UNITS.get(column) in ("count", "round") and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def csv_paths(csv_path, views):
    """{view: file} of --csv: the table at CSV_PATH ("table"), each requested view at CSV_PATH-VIEW.csv."""
    return {"table": csv_path, **{v: sibling(csv_path, v) for v in VIEWS if views.get(v)}}


def _outputs(csv_path, views, figures_drawn):
    """(option, path) of every file this report writes: no two may be the same file."""
    tables_written = list(csv_paths(csv_path, views).values()) if csv_path is not None else []
    return [("--csv", p) for p in tables_written] + [("--plot", p) for p in figures_drawn]


def view_rows(view, runs):
    """The rows of a view as its CSV holds them: one per run (--clients, --attack), per run and class
    (--classes), per run and rank (--timing)."""
    if view == "clients":
        return [r for r in (client_row(run) for run in runs) if r is not None]
    if view == "attack":
        return attack_rows(runs)
    per_run = class_rows if view == "classes" else timing_rows
    return [{"run": run.name, **row} for run in runs for row in (per_run(run) or ())]


# --- figures ----------------------------------------------------------------------------------------------

def figure_paths(runs, by, plot, timing, clients, per_run=False):
    """Every file `--plot PLOT` may write, PLOT first (`_figures_beside`), so that each can be checked before
    the first is drawn."""
    return [plot] + [path for _, _, path in _figures_beside(runs, by, plot, timing, clients, per_run)]


def _figures_beside(runs, by, plot, timing, clients, per_run=False):
    """(kind, run, path) of each figure beside PLOT, in drawing order: with --per-run each run's own figure
    (PLOT-RUN.png), with --clients the local-accuracy CDFs (PLOT-RUN-clients.png), with --timing the phase bars
    (PLOT-timing.png), and each leave-one-out study's contributions (PLOT-contributions.png; the study's name
    in place of the run). The one place that names them: `_draw` draws these, `figure_paths` checks these."""
    names = {"timing"} if timing else set()
    found = [("run", run, sibling(plot, _unique(run.name, names))) for run in (runs if per_run else ())]
    found += [("clients", run, sibling(plot, _unique(f"{run.name}-clients", names)))
              for run in (runs if clients else ())]
    if timing:
        found.append(("timing", None, sibling(plot, "timing")))
    found += [("contributions", study, sibling(plot, _unique(tag, names))) for tag, study in
              contribution_figure_tags(runs)]
    return found


def _draw(runs, by, plot, x, timing, out, err, clients=False, per_run=False, include=None, band="ci95", width=None,
          at_round=None):
    """The figures of --plot: every run in PLOT (fedmpi.analysis.overview, its band the `interval` of --table,
    at `width` inches), then those beside it."""
    for line in missing_curves(runs, ("test_acc",), x):
        print(f"fedmpi: note: {line}", file=err)
    plot_overview(runs, plot, by=by, x=x, include=include, band=band, width=width)
    print(f"figure of {len(runs)} run(s) written to {plot}", file=out)
    for kind, run, path in _figures_beside(runs, by, plot, timing, clients, per_run):
        if kind == "run":
            plot_run(run, path)
            print(f"figure of {run.name} written to {path}", file=out)
        elif kind == "clients":
            if plot_clients(run, path):
                print(f"local accuracy of {run.name} written to {path}", file=out)
        elif kind == "contributions":
            if plot_study(runs, run, path, include, at_round):
                print(f"client contributions of {run} written to {path}", file=out)
            else:
                print(f"fedmpi: note: the study {run} has no finished original and counterfactual: no "
                      f"contribution figure", file=err)
        elif plot_timing(runs, path):
            print(f"phase timing written to {path}", file=out)
        else:
            print("fedmpi: note: no run recorded phase timing (/timing): no timing figure", file=err)


def _unique(name, taken):
    candidate, i = name, 1
    while candidate in taken:
        i += 1
        candidate = f"{name}-{i}"
    taken.add(candidate)
    return candidate
