#!/usr/bin/env python3
"""docs/results/privacy.md: FedAvg, FedProx, FSL and data sharing under client-level DP on mnist5k.

    python tools/privacy_report.py [--rounds R] [--seeds 0 1] [--np 3] --runs runs/privacy --docs docs/results
                                   [--threads T] [--reuse] [--report-only]

Each config of jobs/configs/privacy/ (the 2-class split over 400 clients, Poisson sampling) runs at every
epsilon of EPSILONS: a finite one adds privacy.{mechanism: gaussian, clip: CLIP, target_epsilon, delta:
DELTA}, so the noise multiplier is calibrated to reach that epsilon after the run's rounds; infinity is
the method without any DP mechanism. All runs go into one `mpiexec -n NP` launch (tools/run_batch.py).
Writes the section between the RESULTS markers of DOCS/privacy.md (table and command), DOCS/privacy.png
(test accuracy against rounds, one panel per method) and DOCS/privacy.csv. --reuse keeps finished runs;
--report-only only rereads them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import datetime, timezone

import yaml

from fedmpi import __version__, analysis
from fedmpi.analysis import batch_report, report
from fedmpi.analysis.figures import model_epsilon

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "jobs", "configs", "privacy")
METHODS = (("fedavg", "FedAvg"), ("fedprox", "FedProx"), ("fsl", "FSL"), ("datashare", "Data sharing"))
EPSILONS = (2.0, 8.0, math.inf)
CLIP, DELTA = 0.25, 1e-4
BEGIN, END = "<!-- privacy-report: begin -->", "<!-- privacy-report: end -->"


def parse(argv):
    p = argparse.ArgumentParser(prog="privacy_report.py", description=__doc__.split("\n\n")[0])
    batch_report.add_options(p, "runs/privacy", "folder of privacy.md",
                             rounds_help="rounds per run (default: the configs' 100)")
    return batch_report.place_outputs(p.parse_args(argv), "privacy_report.py")


def command_line(args):
    """The command that regenerates this report (defaults left out)."""
    return batch_report.command_line("privacy_report.py", args, [0, 1])


def eps_name(eps):
    return "inf" if math.isinf(eps) else f"{eps:g}"


def setting_name(method, eps):
    return f"{method}-eps{eps_name(eps)}"


def write_configs(args):
    """One config per (method, epsilon) under RUNS/configs; returns their paths."""
    folder = os.path.join(args.runs, "configs")
    os.makedirs(folder, exist_ok=True)
    paths = []
    for method, _ in METHODS:
        with open(os.path.join(CONFIGS, f"{method}.yaml")) as fh:
            base = yaml.safe_load(fh)
        for eps in EPSILONS:
            cfg = dict(base)
            if not math.isinf(eps):
                cfg["privacy"] = {"mechanism": "gaussian", "clip": CLIP, "target_epsilon": eps, "delta": DELTA}
            path = os.path.join(folder, f"{setting_name(method, eps)}.yaml")
            with open(path, "w") as fh:
                yaml.safe_dump(cfg, fh, sort_keys=False)
            paths.append(path)
    return paths


def run_all(args):
    batch_report.launch("privacy_report.py", args, write_configs(args), args.runs, args.rounds)


def load_groups(args):
    """{(method, epsilon): [runs over the seeds]}; a missing run is an error naming it."""
    settings = {setting_name(method, eps): (method, eps) for method, _ in METHODS for eps in EPSILONS}
    runs = batch_report.load_runs("privacy_report.py", args.runs, list(settings), args.seeds)
    return {settings[name]: group for name, group in runs.items()}


def table_rows(groups):
    rows = []
    for method, label in METHODS:
        for eps in EPSILONS:
            members = groups[method, eps]
            summary = analysis.group_summary(members)
            z = [float(r.attrs["privacy_noise_multiplier"]) for r in members if "privacy_noise_multiplier" in r.attrs]
            reached = [model_epsilon(r) for r in members if "epsilon" in r.metrics]
            clipped = _clipped(members)
            rows.append({"method": label, "epsilon": "∞ (no DP)" if math.isinf(eps) else f"{eps:g}",
                         "noise multiplier": f"{z[0]:.3f}" if z else "-",
                         "epsilon reached": f"{max(reached):.3f}" if reached else "∞",
                         "acc_last20_mean": summary["acc_last20_mean"],
                         "acc_last20_mean_std": summary["acc_last20_mean_std"],
                         "best_acc": summary["best_acc"], "best_acc_std": summary["best_acc_std"],
                         "clipped": "-" if math.isnan(clipped) else f"{100 * clipped:.0f}%",
                         "wall_s": summary["wall_s"]})
    return rows


def _clipped(members):
    """Mean over rounds and runs of the fraction of updates that were clipped (NaN without DP)."""
    values = [v for r in members for v in r.metrics.get("dp_clipped_fraction", []) if math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def draw(groups, path):
    plt = analysis.pyplot()
    fig, axes = plt.subplots(1, len(METHODS), figsize=(4 * len(METHODS), 3.8), sharey=True)
    colors = {eps_name(e): f"C{i}" for i, e in enumerate(EPSILONS)}
    for ax, (method, label) in zip(axes, METHODS):
        chosen = {("ε = ∞ (no DP)" if math.isinf(e) else f"ε = {e:g}"): groups[method, e] for e in EPSILONS}
        analysis.draw_groups(ax, chosen, "test_acc", "round", band="std",
                             colors={k: colors[eps_name(e)] for k, e in zip(chosen, EPSILONS)})
        ax.set_title(label)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("test accuracy (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section(args, rows, groups):
    some = groups[METHODS[0][0], EPSILONS[0]][0]
    rounds = len(some.metrics["round"])
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return "\n".join([
        BEGIN,
        f"Regenerate with `{command_line(args)}` ({len(METHODS)} methods x {len(EPSILONS)} epsilons x "
        f"{len(args.seeds)} seeds in one MPI launch). Measured {when} with fedmpi "
        f"{some.attrs.get('fedmpi_version', __version__)} on {some.attrs.get('hosts', '?')}, "
        f"{some.attrs.get('world_size', '?')} MPI ranks with {some.attrs.get('threads', '?')} torch thread(s) "
        f"each, {rounds} rounds, seeds {', '.join(map(str, args.seeds))}; mean ± sample standard deviation over "
        f"the seeds.",
        "",
        "Configs: `jobs/configs/privacy/`. Finite epsilons add `privacy: {mechanism: gaussian, clip: "
        f"{CLIP:g}, target_epsilon: EPS, delta: {DELTA:g}}}` (RDP accountant), so each run's noise multiplier "
        f"is calibrated to reach EPS after its {rounds} rounds; ∞ is the method without any DP mechanism "
        "(sample-count weights, no clipping), with the same Poisson sampling. acc_last20_mean = mean test accuracy "
        "of the last 20 rounds; clipped = mean fraction of the round's updates that were clipped.",
        "",
        report.format_table(rows, "markdown", left=2),
        "",
        "![test accuracy against rounds under DP](privacy.png)",
        END,
    ])


def write_section(path, text):
    """Replaces the RESULTS markers' section of privacy.md (appends it under a heading the first time)."""
    batch_report.replace_section(path, BEGIN, END, text, "## Results: accuracy under DP on mnist5k")


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if not args.report_only:
        run_all(args)
    groups = load_groups(args)
    rows = table_rows(groups)
    os.makedirs(args.docs, exist_ok=True)
    draw(groups, os.path.join(args.docs, "privacy.png"))
    report.write_csv(rows, os.path.join(args.docs, "privacy.csv"))
    text = section(args, rows, groups)
    write_section(os.path.join(args.docs, "privacy.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
