#!/usr/bin/env python3
"""The federated LoRA study's table and figure (docs/how-to/foundation-models.md): test perplexity of each rule
over rounds, and its difference from a baseline rule within each seed.

    python tools/lora_study.py runs/lora_shakespeare [--baseline fedit] [--plot FILE.png] [--markdown FILE.md]

RUNS are run folders or folders of runs (jobs/sweeps/lora_shakespeare.yaml's). Only finished runs count (the
others are named on stderr). Why paired: a seed fixes everything a rule does not change (the clients each round
picks, their batches, the test windows `eval.max_samples` draws), and the test windows alone move perplexity by
more than the rules differ, so the rules are compared within each seed: the difference from the baseline at the
same seed and round, then its mean and range over the seeds. The table gives, per rule, the final test
perplexity (mean +- sample std over seeds), that paired difference at the last round and averaged over the
second half of the rounds (each seed's mean, then their mean and range), the final token accuracy, the bytes
a round moved and the seconds a run took. Without --plot and --markdown the table is
printed.
"""

from __future__ import annotations

import argparse
import sys

from fedmpi import analysis
from fedmpi.core.errors import InputError
from fedmpi.core.output_paths import check_file

METRIC = "test_perplexity"


def load(paths):
    """(runs frame of the finished runs, perplexity per (rule, seed, round) as a frame); InputError if none."""
    runs = analysis.runs(paths)
    if runs.empty:
        raise InputError(f"{' '.join(map(str, paths))}: no run.h5 found; give the sweep's folder "
                         f"(jobs/sweeps/lora_shakespeare.yaml's out)")
    left = runs[runs["status"] != "finished"]
    for _, row in left.iterrows():
        print(f"lora_study: left out {row['run']} ({row['status']})", file=sys.stderr)
    runs = runs[runs["status"] == "finished"]
    if runs.empty or runs["final_perplexity"].isna().all():
        raise InputError(f"{' '.join(map(str, paths))}: no finished run recorded {METRIC}; give the sweep's folder "
                         f"(jobs/sweeps/lora_shakespeare.yaml)")
    curves = analysis.rounds(runs)
    curves = curves[curves["metric"] == METRIC].merge(runs[["run", "algorithm.name", "seed"]], on="run")
    return runs, curves.rename(columns={"algorithm.name": "rule"})


def paired(curves, baseline):
    """The difference from `baseline` at the same seed and round, per rule (the baseline's own rows left out)."""
    base = curves[curves["rule"] == baseline][["seed", "round", "value"]].rename(columns={"value": "base"})
    if base.empty:
        raise InputError(f"--baseline {baseline!r}: no finished run of it; rules: {sorted(curves['rule'].unique())}")
    diff = curves[curves["rule"] != baseline].merge(base, on=["seed", "round"])
    return diff.assign(diff=diff["value"] - diff["base"])


def table(runs, curves, baseline) -> str:
    last = int(curves["round"].max())
    diff = paired(curves, baseline)
    at_last = diff[diff["round"] == last].groupby("rule")["diff"]
    # the second half of the evaluated rounds, each seed's mean: one round's swing (a step that went astray
    # and came back) weighs less than in the last round alone
    late = diff[diff["round"] > last / 2].groupby(["rule", "seed"])["diff"].mean().groupby("rule")
    lines = [f"| rule | seeds | final test perplexity | minus {baseline}'s, same seed: last round (mean; range) | "
             f"same, rounds {last // 2 + 1}-{last} (mean; range of the seeds' means) | final token accuracy | "
             f"bytes a round | seconds a run |", "| :-- | --: | --: | --: | --: | --: | --: | --: |"]
    for rule, group in runs.groupby("algorithm.name"):
        ppl, acc = group["final_perplexity"], group["final_acc"]
        cells = ["(baseline)", "(baseline)"] if rule == baseline else \
            [_mean_range(at_last.get_group(rule)), _mean_range(late.get_group(rule))]
        per_round = (group["bytes_moved"] / group["rounds_done"]).mean()
        lines.append(f"| {rule} | {len(group)} | {ppl.mean():.3f} ± {ppl.std():.3f} | {' | '.join(cells)} | "
                     f"{acc.mean():.4f} ± {acc.std():.4f} | {per_round / 1e6:.3f} MB | {group['wall_s'].mean():.0f} |")
    return "\n".join(lines) + f"\n\n*At round {last}; ± is the sample standard deviation over the seeds.*\n"


def _mean_range(values):
    return f"{values.mean():+.3f} ({values.min():+.3f} to {values.max():+.3f})"


def figure(curves, baseline, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = sorted(curves["rule"].unique())
    colors = {rule: f"C{i}" for i, rule in enumerate(rules)}
    styles = ["-", "--", ":", "-."]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (rule, seed), group in curves.groupby(["rule", "seed"]):
        left.plot(group["round"], group["value"], color=colors[rule], ls=styles[int(seed) % len(styles)],
                  label=f"{rule}, seed {seed}")
    left.set(xlabel="round", ylabel="test perplexity (lower is better)", title="each rule and seed")
    for (rule, seed), group in paired(curves, baseline).groupby(["rule", "seed"]):
        right.plot(group["round"], group["diff"], color=colors[rule], ls=styles[int(seed) % len(styles)],
                   label=f"{rule}, seed {seed}")
    right.axhline(0.0, color=colors.get(baseline, "k"), lw=1)
    right.set(xlabel="round", ylabel=f"perplexity minus {baseline}'s", title=f"against {baseline}, same seed")
    left.legend(fontsize=7, ncol=2)
    right.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def main(argv=None):
    p = argparse.ArgumentParser(prog="lora_study.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders or folders of runs")
    p.add_argument("--baseline", default="fedit", help="the rule the others are compared with (default fedit)")
    p.add_argument("--plot", metavar="FILE.png", help="write the figure")
    p.add_argument("--markdown", metavar="FILE.md", help="write the table")
    args = p.parse_args(argv)
    try:
        for flag, path in (("--plot", args.plot), ("--markdown", args.markdown)):
            if path:
                check_file(path, flag)
        runs, curves = load(args.runs)
        text = table(runs, curves, args.baseline)
        if args.plot:
            figure(curves, args.baseline, args.plot)
        if args.markdown:
            with open(args.markdown, "w") as fh:
                fh.write(text)
        if not (args.plot or args.markdown):
            print(text, end="")
    except InputError as e:
        print(f"lora_study.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
