"""Post-hoc analysis of run files, as pandas DataFrames (docs/how-to/analysis.md walks through it):

    import fedmpi.analysis as a
    df = a.runs("runs/*")                            # one row per run: config keys, status, every figure
    a.summary(df, by=["method"])                     # per method over seeds: n, left_out, round, mean, std, 95% CI
    a.rounds(df, metrics=["test_acc"])               # tidy: run, round (1-based), metric, value
    print(a.table(a.summary(df), "latex", ["final_acc", "local_acc_mean"]))
    t = a.paper_table(df, rows="method", cols="partition.beta", metric="final_acc")   # methods x settings
    print(t.latex()); print(t.markdown()); t.csv("table.csv")   # mean ± 95% CI, the statistic and n in the caption
    a.plot_overview(a.load_runs(["runs/*"]), "runs.png")   # one figure, a panel per family present

`runs`, `rounds`, `summary` and `table` are in fedmpi.analysis.frames, the methods x settings table
`paper_table` in fedmpi.analysis.paper_table; every summary figure and its one-line definition in
fedmpi.analysis.figures (FIGURES, DEFINITIONS); method labels in fedmpi.analysis.labels. Files still
being written are read up to their last complete round. `fedmpi report` (fedmpi.analysis.command), `fedmpi
export` (fedmpi.analysis.export) and tools/ are layers over the same reader (fedmpi.analysis.report.read_run,
found through fedmpi.analysis.sources) and the same figures. Curves of any per-round figure are in
fedmpi.analysis.curves, grouped sweeps in fedmpi.analysis.sweeps, which runs a grouped result uses (finished
ones by default) and the one round it compares them at in fedmpi.analysis.selection, the instruments' views
in class_report, client_report, attack_report, timing_report and run_figure. Client contributions from
counterfactual runs (leave-one-out, Shapley by enumeration or Monte Carlo, GTG-Shapley from recorded updates)
and their table and figure are in contribution, contribution_rounds, contribution_report and contribution_table;
a stored model evaluated on the test set or on clients' data in model_eval.
"""

from __future__ import annotations

from fedmpi.analysis import report
from fedmpi.analysis.command import figure_paths, report_command
from fedmpi.analysis.contribution import Estimate, exact_shapley, leave_one_out, rank_correlation, tmc_shapley
from fedmpi.analysis.contribution_report import client_traits, leave_one_out_frame
from fedmpi.analysis.contribution_rounds import RoundRecord, gtg_shapley, round_exact_shapley
from fedmpi.analysis.contribution_table import ContributionTable, contribution_table, plot_contributions
from fedmpi.analysis.curves import (
    LABELS,
    X_AXES,
    X_METRICS,
    curve,
    curve_x,
    draw_groups,
    has_x,
    missing_curves,
    plot_curves,
    plot_sweep,
)
from fedmpi.analysis.figures import DEFINITIONS, FIGURES
from fedmpi.analysis.frames import rounds, runs, summary, table
from fedmpi.analysis.labels import method_label
from fedmpi.analysis.overview import plot_overview
from fedmpi.analysis.paper_table import PaperTable, paper_table
from fedmpi.analysis.plotting import pyplot, save_figure
from fedmpi.analysis.sources import config_value, find_run_files, load_runs, run_label
from fedmpi.analysis.sweeps import SWEEP_FIGURES, group_runs, group_summary, sweep_rows

__all__ = ["ContributionTable", "DEFINITIONS", "Estimate", "FIGURES", "LABELS", "PaperTable", "RoundRecord",
           "SWEEP_FIGURES", "X_AXES", "X_METRICS", "client_traits", "config_value", "contribution_table", "curve",
           "curve_x", "draw_groups", "exact_shapley", "figure_paths", "find_run_files", "group_runs", "group_summary",
           "gtg_shapley", "has_x", "leave_one_out", "leave_one_out_frame", "load_runs", "method_label",
           "missing_curves", "paper_table", "plot_contributions", "plot_curves", "plot_overview", "plot_sweep",
           "pyplot", "rank_correlation", "report", "report_command", "round_exact_shapley", "rounds", "run_label",
           "runs", "save_figure", "summary", "sweep_rows", "table", "tmc_shapley"]
