#!/usr/bin/env python3
"""Client contribution on a small case, where every subset can be run: exact Shapley by enumeration against the
estimates that need fewer runs, leave-one-out, Truncated Monte Carlo Shapley and GTG-Shapley from the original's
recorded updates (docs/how-to/counterfactuals.md).

    mpiexec -n 3 fedmpi run CONFIG.yaml checkpoint.updates=true             # the original, its updates recorded
    mpiexec -n 3 fedmpi counterfactual ORIGINAL --out SUBSETS --subsets all   # 2^n - 1 runs, one launch
    python tools/contribution_study.py ORIGINAL SUBSETS --out DIR [--tmc 10,30] [--tolerance 0.01]

A subset S's value is its run's test accuracy at the last round (`--metric test_loss`: minus the loss), the run in
which only the clients of S count; the original is v(N). Written to DIR: contribution.md (the methods' table and
the clients' values), contribution.csv (one row per client and method) and contribution.png (clients ordered by
their exact value, the methods side by side, the attack's malicious clients marked). Cost: the runs a method
needs and their round-loop seconds (each run's final /metrics/wall_s), GTG's the seconds its model evaluations
took. Every run must be finished and as long as the original, or the study is refused.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from fedmpi.analysis.contribution import exact_shapley, leave_one_out, rank_correlation, tmc_shapley
from fedmpi.analysis.contribution_report import client_traits
from fedmpi.core.errors import FedmpiError, InputError
from fedmpi.core.tool_outputs import OneLineParser, ToolUsageError, output_or_default

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(argv):
    p = OneLineParser(prog="tools/contribution_study.py", description=__doc__.split("\n\n")[0])
    p.add_argument("original", help="the original run's folder")
    p.add_argument("subsets", help="the folder of `fedmpi counterfactual --subsets all`")
    p.add_argument("--out", help="folder for the table and figure (default ./runs/contribution-study; refused "
                                 "inside the checkout)")
    p.add_argument("--metric", choices=("test_acc", "test_loss"), default="test_acc")
    p.add_argument("--tmc", default="10,30", help="TMC's permutation budgets, comma-separated (default 10,30)")
    p.add_argument("--tolerance", type=float, default=0.01, help="TMC's truncation tolerance (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="the estimates' random orders")
    p.add_argument("--tmc-seeds", type=int, default=10, help="TMC repeated with this many seeds (seed, seed+1, ...) "
                                                             "for the spread of its accuracy (default 10)")
    args = p.parse_args(argv)
    args.out = output_or_default(args.out, "tools/contribution_study.py", os.path.join("runs", "contribution-study"),
                                 "--out", ROOT)
    try:
        args.tmc = [int(x) for x in args.tmc.split(",") if x.strip()]
    except ValueError:
        raise ToolUsageError(f"--tmc {args.tmc!r}: expected permutation counts, e.g. 10,30") from None
    if not args.tmc or min(args.tmc) < 1:
        raise ToolUsageError(f"--tmc {args.tmc!r}: expected positive permutation counts, e.g. 10,30")
    return args


def _run_value(folder, metric):
    """(value, the run's clients dropped, round-loop seconds, rounds, config) of a finished run (read as `fedmpi
    report` reads it); InputError otherwise."""
    from fedmpi.analysis.report import one_line, read_run

    path = os.path.join(folder, "run.h5")
    try:
        run = read_run(path)
        series, wall = run.metrics[metric], float(run.metrics["wall_s"][-1])
    except (OSError, KeyError, ValueError, RuntimeError, IndexError) as e:
        raise InputError(f"{path}: cannot be read as a finished run ({one_line(e)})") from None
    status = str(run.attrs.get("status", ""))
    if status != "finished" or not np.isfinite(series[-1]):
        raise InputError(f"{path}: status {status!r}, final {metric} {series[-1]}; every run of the study must "
                         f"have finished (start the launch again to finish it)")
    value = float(series[-1]) if metric == "test_acc" else -float(series[-1])
    drop = ((run.config.get("counterfactual") or {}).get("drop")) or []
    return value, frozenset(int(c) for c in drop), wall, len(series), run.config


def game(original, subsets, metric):
    """({subset: value}, {subset: seconds}, the players, the original's config): every subset's run read."""
    value, _, wall, rounds, cfg = _run_value(original, metric)
    players = frozenset(range(int(cfg["partition"]["clients"])))
    values, seconds = {players: value}, {players: wall}
    for name in sorted(os.listdir(subsets)):
        folder = os.path.join(subsets, name)
        if not os.path.isfile(os.path.join(folder, "run.h5")):
            continue
        v, drop, w, r, _ = _run_value(folder, metric)
        if r != rounds:
            raise InputError(f"{folder}: {r} rounds, the original {rounds}; compare runs of one length")
        values[players - drop], seconds[players - drop] = v, w
    missing = 2 ** len(players) - len(values)
    if missing:
        raise InputError(f"{subsets}: {missing} of the {2 ** len(players)} subsets have no run; run `fedmpi "
                         f"counterfactual {original} --out {subsets} --subsets all` (again) to finish them")
    return values, seconds, sorted(players), cfg


def recorded_gtg(original, metric, seed):
    """(GTG-Shapley Estimate, seconds) from the original's recorded updates, or (None, reason)."""
    from fedmpi.analysis.contribution_rounds import gtg_shapley
    from fedmpi.analysis.model_eval import RunEvaluator

    if not os.path.isdir(os.path.join(original, "updates")):
        return None, "the original recorded no updates (run it with checkpoint.updates=true)"
    from fedmpi.uploads.recorded import read_updates

    rounds = read_updates(original)
    utility = RunEvaluator.from_run(original).utility("accuracy" if metric == "test_acc" else "neg_loss")
    began = time.perf_counter()
    estimate = gtg_shapley(rounds, utility, seed=seed)
    return estimate, time.perf_counter() - began


def rows(values, seconds, players, args):
    """[(method, {client: value}, cost text, seconds, stderr or None)] for every method."""
    exact = exact_shapley(values, players)
    full = frozenset(players)
    out = [("Shapley (exact, enumeration)", exact, f"{len(values)} runs", sum(seconds.values()), None)]
    loo = leave_one_out(values[full], {c: values[full - {c}] for c in players})
    out.append(("Leave-one-out", loo, f"{len(players) + 1} runs",
                seconds[full] + sum(seconds[full - {c}] for c in players), None))
    for budget in args.tmc:
        est = tmc_shapley(values.__getitem__, players, permutations=budget, tolerance=args.tolerance, seed=args.seed)
        asked = est.evaluated | {full}
        out.append((f"TMC-Shapley ({budget} permutations)", est.values, f"{len(asked)} runs",
                    sum(seconds[s] for s in asked), est.stderr))
    gtg, spent = recorded_gtg(args.original, args.metric, args.seed)
    if gtg is None:
        print(f"contribution_study: GTG-Shapley left out: {spent}", file=sys.stderr)
    else:
        out.append(("GTG-Shapley (recorded updates)", gtg.values, f"1 run + {len(gtg.evaluated)} model evaluations",
                    seconds[full] + spent, gtg.stderr))
    return exact, out


def tmc_spread(values, players, exact, args):
    """Markdown rows: TMC at each budget over --tmc-seeds seeds, the runs it asked for and its agreement with
    the exact values (mean, min-max over the seeds)."""
    lines = ["| TMC budget | seeds | runs | Spearman vs exact | mean abs error | malicious clients the lowest |",
             "|---|---|---|---|---|---|"]
    full = frozenset(players)
    for budget in args.tmc:
        runs, rho, err, lowest = [], [], [], 0
        for seed in range(args.seed, args.seed + args.tmc_seeds):
            est = tmc_shapley(values.__getitem__, players, permutations=budget, tolerance=args.tolerance, seed=seed)
            runs.append(len(est.evaluated | {full}))
            rho.append(rank_correlation(est.values, exact))
            err.append(float(np.mean([abs(est.values[c] - exact[c]) for c in exact])))
            lowest += set(sorted(est.values, key=est.values.get)[:len(args.malicious)]) == args.malicious
        lines.append(f"| {budget} permutations | {args.tmc_seeds} | {np.mean(runs):.0f} ({min(runs)}-{max(runs)}) | "
                     f"{np.mean(rho):.3f} ({min(rho):.3f}-{max(rho):.3f}) | {np.mean(err):.4f} "
                     f"({min(err):.4f}-{max(err):.4f}) | {lowest} of {args.tmc_seeds} |")
    return "\n".join(lines) + "\n"


def markdown(exact, methods, malicious, metric):
    order = sorted(exact, key=exact.get)
    lowest = "the lowest" if set(order[:len(malicious)]) == set(malicious) else "NOT the lowest"
    lines = [f"Value of a subset: the {metric} at the last round of the run in which only its clients count "
             f"({'minus the loss' if metric == 'test_loss' else 'accuracy'}); malicious clients: "
             f"{sorted(malicious) or 'none'} ({lowest} under the exact values).",
             "", "| method | cost | compute s | Spearman vs exact | max abs error | mean abs error | "
             "malicious clients' ranks (1 = lowest) |", "|---|---|---|---|---|---|---|"]
    for name, values, cost, secs, _ in methods:
        err = [abs(values.get(c, 0.0) - exact[c]) for c in exact]
        ranked = sorted(values, key=values.get)
        ranks = ", ".join(str(ranked.index(c) + 1) for c in sorted(malicious)) or "-"
        lines.append(f"| {name} | {cost} | {secs:.1f} | {rank_correlation(values, exact):.3f} | {max(err):.4f} | "
                     f"{np.mean(err):.4f} | {ranks} |")
    lines += ["", "| client | " + " | ".join(m[0] for m in methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for c in order[::-1]:
        cells = []
        for _, values, _, _, stderr in methods:
            cell = f"{values.get(c, 0.0):+.4f}"
            if stderr is not None and np.isfinite(stderr.get(c, np.nan)):
                cell += f" ± {stderr[c]:.4f}"
            cells.append(cell)
        lines.append(f"| {c}{' (malicious)' if c in malicious else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path, methods, malicious):
    with open(path, "w") as fh:
        fh.write("method,client,value,stderr,malicious\n")
        for name, values, _, _, stderr in methods:
            for c in sorted(values):
                se = "" if stderr is None else f"{stderr.get(c, float('nan')):.6g}"
                fh.write(f"\"{name}\",{c},{values[c]:.6g},{se},{int(c in malicious)}\n")


def plot(path, exact, methods, malicious, metric):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = sorted(exact, key=exact.get)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / len(methods)
    for i, (name, values, _, _, stderr) in enumerate(methods):
        xs = np.arange(len(order)) + (i - (len(methods) - 1) / 2) * width
        err = None if stderr is None else [stderr.get(c, 0.0) for c in order]
        ax.bar(xs, [values.get(c, 0.0) for c in order], width, yerr=err, label=name, capsize=1.5)
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([f"{c}{'*' if c in malicious else ''}" for c in order])
    for tick, c in zip(ax.get_xticklabels(), order):
        if c in malicious:
            tick.set_color("tab:red")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("client, ordered by its exact Shapley value (* red: label-flipping)")
    ax.set_ylabel(f"contribution to {metric}")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv=None):
    try:
        args = parse(argv)
        values, seconds, players, cfg = game(args.original, args.subsets, args.metric)
        exact, methods = rows(values, seconds, players, args)
    except (ToolUsageError, FedmpiError) as e:
        print(f"contribution_study: {e}", file=sys.stderr)
        return 2
    traits = client_traits(args.original)
    malicious = {int(c) for c in traits.loc[traits["malicious"].astype(bool), "client"]}
    args.malicious = malicious
    os.makedirs(args.out, exist_ok=True)
    text = markdown(exact, methods, malicious, args.metric) + "\n" + tmc_spread(values, players, exact, args)
    with open(os.path.join(args.out, "contribution.md"), "w") as fh:
        fh.write(text)
    write_csv(os.path.join(args.out, "contribution.csv"), methods, malicious)
    plot(os.path.join(args.out, "contribution.png"), exact, methods, malicious, args.metric)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
