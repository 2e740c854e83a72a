#!/usr/bin/env python3
"""The deployment comparison of docs/how-to/deployment.md: runs jobs/configs/deploy/ on mnist5k under one simulated
deployment and writes the results section and docs/results/deployment.png.

    python tools/deploy_report.py [--rounds R] [--seeds 0 1] [--np 3] --runs runs/deploy --docs docs/results
                                  [--target 0.8] [--threads T] [--reuse] [--report-only]

SAFL's upload gating, FedSkip, data sharing and FedBuff against FedAvg with dense, top-k and QSGD uploads,
each config once per seed, in one `mpiexec -n NP` launch (tools/run_batch.py); FedBuff runs twice the
rounds (updates of 5 arrivals: as many client updates as FedAvg's rounds of 10), so --rounds R gives it 2R
in a second launch. Writes the section between the markers RESULTS_START and RESULTS_END of
DOCS/deployment.md (the table as measured, with the command that regenerates it), DOCS/deployment.png
(test accuracy against uploaded bytes and against simulated time, mean +- std over the seeds) and
DOCS/deployment.csv. --reuse keeps finished runs; --report-only only rereads the runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone

import numpy as np

from fedmpi import __version__, analysis
from fedmpi.analysis import batch_report, figures, report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "jobs", "configs", "deploy")
# (config, label, rounds relative to the others)
SETTINGS = (
    ("fedavg", "FedAvg, dense", 1),
    ("topk", "FedAvg + top-k 5% (EF)", 1),
    ("qsgd", "FedAvg + QSGD 4 levels", 1),
    ("safl_gated", "SAFL, gated uploads", 1),
    ("fedskip", "FedSkip, delta 3", 1),
    ("datashare", "Data sharing", 1),
    ("fedbuff", "FedBuff, K 5 of 10", 2),
)
RESULTS_START = "<!-- deploy_report.py: results start -->"
RESULTS_END = "<!-- deploy_report.py: results end -->"
FINAL_EVALS = 5


def parse(argv):
    p = argparse.ArgumentParser(prog="deploy_report.py", description=__doc__.split("\n\n")[0])
    batch_report.add_options(p, "runs/deploy", "folder holding deployment.md",
                             rounds_help="rounds per run (default: the configs' 50; FedBuff twice that)")
    p.add_argument("--target", type=float, default=0.8, help="accuracy for the time-to-target column")
    return batch_report.place_outputs(p.parse_args(argv), "deploy_report.py")


def command_line(args):
    return batch_report.command_line("deploy_report.py", args, [0, 1])


def run_all(args):
    launches = {}       # rounds override -> configs
    for name, _, scale in SETTINGS:
        rounds = None if args.rounds is None else args.rounds * scale
        launches.setdefault(rounds, []).append(os.path.join(CONFIGS, f"{name}.yaml"))
    for rounds, configs in launches.items():
        batch_report.launch("deploy_report.py", args, configs, args.runs, rounds)


def load_groups(args):
    return batch_report.load_runs("deploy_report.py", args.runs, [name for name, _, _ in SETTINGS], args.seeds)


# -- figures of one run -----------------------------------------------------------------------------------

def uploaded(run):
    """Cumulative bytes uploaded after each round."""
    return np.cumsum(np.asarray(run.metrics["bytes_up"], dtype=np.float64))


def accuracy_at(run, x, budget):
    """Test accuracy of the last evaluation at or before `budget` on the axis `x` (NaN if none)."""
    acc = np.asarray(run.metrics["test_acc"], dtype=np.float64)
    ok = np.isfinite(acc) & (x <= budget * (1 + 1e-12))
    return float(acc[ok][-1]) if ok.any() else np.nan


def time_to(run, target):
    acc = np.asarray(run.metrics["test_acc"], dtype=np.float64)
    hit = np.flatnonzero(np.nan_to_num(acc) >= target)
    return float(run.metrics["sim_time_s"][hit[0]]) if len(hit) else np.nan


def final_accuracy(run):
    """The mean of the last FINAL_EVALS evaluations (fedmpi.analysis.figures' acc_last20_mean with this window)."""
    return figures.acc_last_mean(run, FINAL_EVALS)


def mean_std(values):
    v = np.array([x for x in values if np.isfinite(x)], dtype=np.float64)
    if not len(v):
        return np.nan, np.nan
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else np.nan


def table_rows(groups, target):
    """One row per setting; the budgets are the smallest total upload and the shortest run (simulated)."""
    budget = min(np.mean([uploaded(r)[-1] for r in runs]) for runs in groups.values())
    horizon = min(np.mean([r.metrics["sim_time_s"][-1] for r in runs]) for runs in groups.values())
    rows = []
    for name, label, _ in SETTINGS:
        runs = groups[name]
        figures = {
            "final_acc": [final_accuracy(r) for r in runs],
            "acc_at_budget": [accuracy_at(r, uploaded(r), budget) for r in runs],
            "acc_at_time": [accuracy_at(r, np.asarray(r.metrics["sim_time_s"]), horizon) for r in runs],
            "time_to_target_s": [time_to(r, target) for r in runs],
            "kB_per_upload": [r.metrics["bytes_up"].sum() / max(r.metrics["uploads"].sum(), 1) / 1e3 for r in runs],
            "uploads": [r.metrics["uploads"].sum() for r in runs],
            "uploaded_MB": [uploaded(r)[-1] / 1e6 for r in runs],
            "sim_time_s": [r.metrics["sim_time_s"][-1] for r in runs],
        }
        row = {"setting": label, "config": name, "runs": len(runs),
               "reached": f"{sum(np.isfinite(time_to(r, target)) for r in runs)}/{len(runs)}"}
        for key, values in figures.items():
            row[key], row[f"{key}_std"] = mean_std(values)
        rows.append(row)
    return rows, budget, horizon


def markdown_table(rows):
    def cell(row, key, digits):
        mean, std = row[key], row.get(f"{key}_std", np.nan)
        if not np.isfinite(mean):
            return "-"
        text = f"{mean:.{digits}f}"
        return text + (f" ± {std:.{digits}f}" if np.isfinite(std) else "")

    columns = [("final_acc", "final acc", 3), ("acc_at_budget", "acc at upload budget", 3),
               ("acc_at_time", "acc at time budget", 3), ("time_to_target_s", "sim s to target", 0),
               ("kB_per_upload", "kB / upload", 1), ("uploads", "uploads", 0), ("uploaded_MB", "uploaded MB", 1),
               ("sim_time_s", "sim s total", 0)]
    head = ["setting", "runs", "reached"] + [title for _, title, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join([":--"] + ["--:"] * (len(head) - 1)) + " |"]
    for row in rows:
        cells = [row["setting"], str(row["runs"]), row["reached"]] + [cell(row, k, d) for k, _, d in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- the figure --------------------------------------------------------------------------------------------

def draw(groups, path):
    plt = analysis.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    for i, (name, label, _) in enumerate(SETTINGS):
        runs = groups[name]
        n = min(len(r.metrics["round"]) for r in runs)
        ys = np.array([np.asarray(r.metrics["test_acc"][:n], dtype=np.float64) for r in runs])
        keep = np.isfinite(ys).all(axis=0)
        mean = ys[:, keep].mean(axis=0)
        std = ys[:, keep].std(axis=0, ddof=1) if len(runs) > 1 else None
        for ax, xs in ((axes[0], [uploaded(r)[:n] / 1e6 for r in runs]),
                       (axes[1], [np.asarray(r.metrics["sim_time_s"][:n], dtype=np.float64) for r in runs])):
            x = np.mean(xs, axis=0)[keep]
            ax.plot(x, mean, label=f"{label} ({len(runs)})", color=f"C{i}")
            if std is not None:
                ax.fill_between(x, mean - std, mean + std, color=f"C{i}", alpha=0.2, linewidth=0)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("uploaded (MB, cumulative; log scale)")
    axes[1].set_xlabel("simulated time (s)")
    axes[0].set_ylabel("test accuracy (mean +- std over seeds)")
    for ax, title in zip(axes, ("Accuracy against uploaded bytes", "Accuracy against simulated time")):
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the section -----------------------------------------------------------------------------------------

def section(args, rows, budget, horizon, groups):
    some = groups["fedavg"][0]
    rounds = len(some.metrics["round"])
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return "\n".join([
        RESULTS_START,
        f"Regenerate with `{command_line(args)}` ({len(SETTINGS)} configs x {len(args.seeds)} seeds). Measured "
        f"{when} with fedmpi {some.attrs.get('fedmpi_version', __version__)} on {some.attrs.get('hosts', '?')}, "
        f"{some.attrs.get('world_size', '?')} MPI ranks, {rounds} rounds (FedBuff {2 * rounds} updates), seeds "
        f"{', '.join(map(str, args.seeds))}; mean ± sample standard deviation over the seeds.",
        "",
        f"Columns: final acc = mean of the last {FINAL_EVALS} evaluations; acc at upload budget = test accuracy "
        f"once {budget / 1e6:.1f} MB have been uploaded (the smallest total upload of the set); acc at time "
        f"budget = test accuracy at {horizon:.0f} simulated seconds (the shortest run of the set); sim s to "
        f"target = simulated seconds until the test accuracy first reaches {args.target} (`reached` counts the "
        "seeds that got there); kB / upload = uploaded bytes per update that counted; uploads = updates that "
        "counted (dropped clients send nothing).",
        "",
        markdown_table(rows),
        "",
        "![test accuracy against uploaded bytes and against simulated time](deployment.png)",
        RESULTS_END,
    ])


def write_section(path, text):
    """Replaces the text between the markers in `path` (appends a results heading and the section if the
    markers are missing)."""
    batch_report.replace_section(path, RESULTS_START, RESULTS_END, text, "## Results")


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if not args.report_only:
        run_all(args)
    groups = load_groups(args)
    rows, budget, horizon = table_rows(groups, args.target)
    os.makedirs(args.docs, exist_ok=True)
    draw(groups, os.path.join(args.docs, "deployment.png"))
    report.write_csv(rows, os.path.join(args.docs, "deployment.csv"))
    text = section(args, rows, budget, horizon, groups)
    write_section(os.path.join(args.docs, "deployment.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
