#!/usr/bin/env python3
"""The robustness study: FedAvg against robust aggregators under attacks, on mnist5k.

    mpiexec -n 3 fedmpi sweep jobs/sweeps/robustness.yaml     # the grid's runs (continues where it stopped)
    python tools/robustness.py --docs docs/results [--runs runs/robustness] [--seeds 0 1 2]

Grid (jobs/sweeps/robustness.yaml): 2 partitions (IID, Dirichlet(0.1)) x 7 attacks (none, label flip, sign
flip, sign flip x4, ALIE with its z_max and with z = 1, backdoor) x 5 aggregators (FedAvg = the plain weighted
mean, coordinate-wise median, trimmed mean, Krum, FLTrust) x the seeds. Setting (jobs/configs/grids/
robustness.yaml): mnist5k, 20 clients, 10 per round, 20 rounds, multinomial logistic regression (model lr),
client lr 0.05, batch 20, 1 epoch, 20% malicious clients (4 of 20, drawn from the seed). Figures: test
accuracy and backdoor accuracy as the mean over the last 10% of rounds (the last 2), mean ± sample std over
seeds.

This script runs nothing: it reads the sweep's runs (fedmpi.sweep.results: each experiment's cell is the
names of its sets in the spec, its run read through fedmpi.analysis) and writes DOCS/robustness.csv (one row
per partition, attack and aggregator) and the section between `<!-- robustness -->` and `<!-- /robustness -->`
of DOCS/reproduction.md, and prints it. A cell without a finished run says why: "missing" (not run yet: the
line printed names the command), "refused" (the sweep's index says the experiment was refused, with its
reason), or the run's status ("failed", "diverged"); the claims are judged only on cells that ran.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import os
import re
import sys

import numpy as np

from fedmpi.analysis import figures
from fedmpi.core.tool_outputs import output_or_default
from fedmpi.sweep import results as sweep_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join("jobs", "sweeps", "robustness.yaml")
CHANCE = 0.1            # mnist: ten classes
# The claims' three-valued rule (holds, does not hold, not decided with its cause): reproduce_claims.decide.
_claims_spec = importlib.util.spec_from_file_location("reproduce_claims", os.path.join(ROOT, "tools",
                                                                                    "reproduce_claims.py"))
_claims = importlib.util.module_from_spec(_claims_spec)
_claims_spec.loader.exec_module(_claims)
TAIL = 0.1              # figures: the mean over the last 10% of rounds

# The table's name of each set of the spec (its `name`), per axis; a set the spec adds shows by its own name.
PARTITIONS = {"IID": "iid", "Dir(0.1)": "dir0.1"}
ATTACKS = {"no attack": "none", "label flip": "label_flip", "sign flip": "sign_flip", "sign flip x4": "sign_flip_x4",
           "ALIE": "alie", "ALIE z=1": "alie_z1", "backdoor": "backdoor"}
AGGREGATORS = {"FedAvg": "fedavg", "median": "median", "trimmed mean": "trimmed_mean", "Krum": "krum",
               "FLTrust": "fltrust"}
AXES = (("partition", PARTITIONS), ("attack", ATTACKS), ("aggregator", AGGREGATORS))
CLAIMS = {
    "no attack": "defenses lose accuracy under strong label skew (Karimireddy et al. 2022; Li et al. 2023)",
    "label flip": "20% label flippers cost FedAvg little (Tolpegin et al. 2020)",
    "sign flip": "FedAvg breaks under sign flip (Blanchard et al. 2017); robust rules hold",
    "sign flip x4": "FedAvg breaks under sign flip (Blanchard et al. 2017); robust rules hold",
    "ALIE": "ALIE evades median and Krum (Baruch et al. 2019)",
    "ALIE z=1": "ALIE evades median and Krum (Baruch et al. 2019)",
    "backdoor": "robust rules do not stop a backdoor (Bagdasaryan et al. 2020; Sun et al. 2019)",
}


def tail_mean(values):
    """The figure's mean over the last 10% of rounds (fedmpi.analysis.figures: backdoor_acc_tail10's definition)."""
    return figures.tail_mean(np.asarray(values, dtype=np.float64), TAIL)


def cell_of(result):
    """(partition, attack, aggregator) of a sweep experiment in the table's names."""
    return tuple(next((shown for shown, name in names.items() if name == result.experiment.labels[axis]),
                      result.experiment.labels[axis]) for axis, names in AXES)


def read_cells(results):
    """{(partition, attack, aggregator): {'acc': [per finished seed], 'backdoor': [...], 'absent': [(experiment,
    status, message)]}} in the spec's order, from the sweep's results (fedmpi.sweep.results.read)."""
    cells = {}
    for r in results:
        cell = cells.setdefault(cell_of(r), {"acc": [], "backdoor": [], "absent": []})
        if r.status != sweep_results.READY:
            cell["absent"].append((r.experiment.name, r.status, r.message))
            continue
        cell["acc"].append(tail_mean(r.run.metrics["test_acc"]))
        cell["backdoor"].append(tail_mean(r.run.metrics["backdoor_acc"]) if "backdoor_acc" in r.run.metrics
                                else np.nan)
    return cells


def axis_values(cells, i):
    """The values of the table's axis i, in the order the spec gives them."""
    return list(dict.fromkeys(key[i] for key in cells))


def mean_std(values):
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def acc(cells, partition, attack, aggregator):
    cell = cells.get((partition, attack, aggregator), {})
    return mean_std(cell["acc"])[0] if "acc" in cell else float("nan")


def bd(cells, partition, attack, aggregator):
    cell = cells.get((partition, attack, aggregator), {})
    return mean_std(cell["backdoor"])[0] if "backdoor" in cell else float("nan")


def judge(gap, cells, keys, metric="acc"):
    """The three-valued verdict on a claim's `gap` (in its favour) over the cells `keys`, against the largest
    std over the seeds among them; None where a cell has no finished run."""
    values = {key: np.asarray(cells.get(key, {}).get(metric, []), dtype=np.float64) for key in keys}
    values = {key: v[np.isfinite(v)] for key, v in values.items()}
    if any(not len(v) for v in values.values()) or math.isnan(gap):
        return None
    rows = {", ".join(key): {"final_acc": float(v.mean()), "final_acc_std": float(v.std(ddof=1)) if len(v) > 1
                             else math.nan} for key, v in values.items()}          # one seed: no spread
    return _claims.decide(gap, rows)


def pts(x):
    return f"{100 * x:.1f}%"


# --- the claims, judged on the measured cells --------------------------------------------------------------

def verdicts(cells):
    """[(verdict or None, claim, evidence)] from the measured cells (None: not measured here); each claim's
    threshold becomes the gap that decide() weighs against the seeds' spread."""
    out = []
    for attack in ("sign flip", "sign flip x4"):
        for partition in PARTITIONS:
            clean, hit = acc(cells, partition, "no attack", "FedAvg"), acc(cells, partition, attack, "FedAvg")
            # "breaks": less than half of the clean accuracy above chance is left
            holds = judge(0.5 * (clean - CHANCE) - (hit - CHANCE), cells,
                          [(partition, "no attack", "FedAvg"), (partition, attack, "FedAvg")])
            out.append((holds, f"FedAvg breaks under {attack} ({partition}; breaks = under half of its clean "
                               f"accuracy above chance left)",
                        f"FedAvg {pts(hit)} under attack vs {pts(clean)} without"))
    for attack in ("ALIE", "ALIE z=1"):
        for aggregator in ("median", "Krum"):
            for partition in PARTITIONS:
                clean, hit = acc(cells, partition, "no attack", aggregator), acc(cells, partition, attack, aggregator)
                holds = judge(clean - hit - 0.05, cells, [(partition, "no attack", aggregator),
                                                          (partition, attack, aggregator)])
                out.append((holds, f"{attack} evades {aggregator} ({partition}; evades = costs it >= 5 points)",
                            f"{aggregator} {pts(hit)} under {attack} vs {pts(clean)} without"))
    for aggregator in [a for a in AGGREGATORS if a != "FedAvg"]:
        skew = acc(cells, "Dir(0.1)", "no attack", "FedAvg") - acc(cells, "Dir(0.1)", "no attack", aggregator)
        iid = acc(cells, "IID", "no attack", "FedAvg") - acc(cells, "IID", "no attack", aggregator)
        holds = judge(min(skew - 0.02, skew - iid), cells, [(p, "no attack", a) for p in ("Dir(0.1)", "IID")
                                                            for a in ("FedAvg", aggregator)])
        out.append((holds, f"{aggregator} loses accuracy under strong label skew without attack (loses = >= 2 "
                           f"points below FedAvg at Dir(0.1), more than at IID)",
                    f"gap to FedAvg {100 * skew:+.1f} points at Dir(0.1), {100 * iid:+.1f} at IID"
                    if not math.isnan(skew) else "not measured"))
    for partition in PARTITIONS:
        clean, hit = acc(cells, partition, "no attack", "FedAvg"), acc(cells, partition, "label flip", "FedAvg")
        holds = judge(0.05 - (clean - hit), cells, [(partition, "no attack", "FedAvg"),
                                                    (partition, "label flip", "FedAvg")])
        out.append((holds, f"20% label flippers cost FedAvg little ({partition}; little = < 5 points)",
                    f"FedAvg {pts(hit)} under label flip vs {pts(clean)} without"))
    for aggregator in [a for a in AGGREGATORS if a != "FedAvg"]:
        rates = [bd(cells, p, "backdoor", aggregator) for p in PARTITIONS]
        holds = judge(min(rates) - 0.5, cells, [(p, "backdoor", aggregator) for p in PARTITIONS], "backdoor")
        out.append((holds, f"{aggregator} does not stop the backdoor (backdoor accuracy >= 50% at both splits)",
                    "backdoor accuracy " + ", ".join(f"{p} {pts(r)}" for p, r in zip(PARTITIONS, rates))))
    return out


# --- output ----------------------------------------------------------------------------------------------

def absent_word(cell):
    """Why a cell has no number: refused (the sweep's index), missing (not run yet) or the runs' status."""
    statuses = {status for _, status, _ in cell["absent"]}
    if "refused" in statuses:
        return "refused"
    return "missing" if statuses <= {"missing", "pending"} else "/".join(sorted(statuses))


def cell_text(cells, partition, attack, aggregator):
    cell = cells.get((partition, attack, aggregator))
    if cell is None:
        return "—"
    if not cell["acc"]:
        return absent_word(cell)
    m, s = mean_std(cell["acc"])
    text = f"{m:.3f} ± {s:.3f}"
    if attack == "backdoor":
        b, bs = mean_std(cell["backdoor"])
        text += f" (bd {b:.3f} ± {bs:.3f})"
    if cell["absent"]:
        text += f" ({len(cell['acc'])} of {len(cell['acc']) + len(cell['absent'])} seeds)"
    return text


def not_run(cells):
    """{reason: [cells]} of the experiments a sweep refused, or whose run failed (plain missing ones aside)."""
    out = {}
    for (partition, attack, aggregator), cell in cells.items():
        for _, status, message in cell["absent"]:
            if status not in ("missing", "pending"):
                out.setdefault(f"{status}: {message}" if message else status, set()).add(
                    f"{partition}, {attack}, {aggregator}")
    return out


def section(cells, results, missing=None):
    partitions, attacks, aggregators = (axis_values(cells, i) for i in range(3))
    ran = sweep_results.finished(results)
    seeds = sorted({r.seed for r in results}, key=str)
    rounds = len(ran[0].metrics["round"]) if ran else "?"
    wall = sweep_results.training_s(results)
    version = ran[0].attrs.get("fedmpi_version", "?") if ran else "?"
    started = max((str(run.attrs.get("started", ""))[:10] for run in ran), default="") or "?"
    head = ["split", "attack", *aggregators, "published claim"]
    lines = ["<!-- robustness -->", "## Robustness: FedAvg and robust aggregators under attack", "",
             "Setting (jobs/sweeps/robustness.yaml): mnist5k, 20 clients, 10 per round, "
             f"{rounds} rounds, model lr (multinomial logistic regression), client lr 0.05, batch 20, 1 "
             "epoch; 20% of the clients malicious (4 of 20, drawn from the seed); IID and Dirichlet(0.1) "
             "label skew. Attacks: label flip l -> 9-l; sign flip -Delta and -4 Delta; ALIE (z from n and the "
             "malicious count: about 0.25 when 2 of 10 are malicious; and z = 1); backdoor: 3x3 bright patch, "
             "target 0, half of each malicious batch, no "
             "boost. FLTrust's root set: 100 server images (server_data.size). Cells: test accuracy, the mean "
             "of the last 10% of rounds, mean ± std over seeds "
             f"{', '.join(map(str, seeds))}; backdoor rows add the backdoor accuracy (bd: triggered "
             "non-target test images classified as 0). "
             f"Measured (last run started {started}) with fedmpi {version}: {len(ran)} runs, "
             f"{wall / 60:.1f} minutes of training in all. Regenerate: `mpiexec -n 3 fedmpi sweep "
             "jobs/sweeps/robustness.yaml`, then `python tools/robustness.py --docs docs/results` (writes "
             "docs/results/robustness.csv).", "",
             "| " + " | ".join(head) + " |", "| " + " | ".join([":--", ":--"] + ["--:"] * len(aggregators)
                                                               + [":--"]) + " |"]
    for partition in partitions:
        for attack in attacks:
            row = [partition, attack] + [cell_text(cells, partition, attack, a) for a in aggregators]
            lines.append("| " + " | ".join(row + [CLAIMS.get(attack, "")]) + " |")
    lines += ["", "Claims, judged on these numbers (the gap to each claim's threshold against the seeds' spread, "
              "the largest std of the cells compared: holds, does not hold, or not decided when within it):", ""]
    for verdict, claim, evidence in verdicts(cells):
        if verdict is None:
            lines.append(f"- **not measured**: {claim} (its cells have no finished runs).")
            continue
        lines.append(f"- **{verdict}**: {claim}. Measured: {evidence}.")
    reasons = not_run(cells)
    if reasons:
        lines += ["", "Not measured (the sweep's index or the run says why):", ""]
        lines += [f"- {'; '.join(sorted(whats))}: {why}" for why, whats in reasons.items()]
    if missing:
        lines += ["", f"Missing: {missing}."]
    lines.append("<!-- /robustness -->")
    return "\n".join(lines)


def write_csv(cells, path):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["split", "attack", "aggregator", "seeds", "test_acc", "test_acc_std", "backdoor_acc",
                    "backdoor_acc_std", "refused"])
        for (partition, attack, aggregator), cell in cells.items():
            if not cell["acc"]:
                reasons = "; ".join(f"{status}: {message}" if message else status
                                    for _, status, message in cell["absent"])
                w.writerow([partition, attack, aggregator, 0, "", "", "", "", reasons])
                continue
            m, s = mean_std(cell["acc"])
            b, bs = mean_std(cell["backdoor"])
            w.writerow([partition, attack, aggregator, len(cell["acc"]), f"{m:.4f}", f"{s:.4f}",
                        "" if math.isnan(b) else f"{b:.4f}", "" if math.isnan(bs) else f"{bs:.4f}", ""])


def insert(md_path, text):
    existing = open(md_path).read() if os.path.exists(md_path) else ""
    pattern = re.compile(r"<!-- robustness -->.*?<!-- /robustness -->", flags=re.S)
    updated = pattern.sub(lambda _: text, existing) if pattern.search(existing) else \
        existing.rstrip("\n") + "\n\n" + text + "\n"
    with open(md_path, "w") as fh:
        fh.write(updated)


def main(argv=None):
    p = argparse.ArgumentParser(prog="robustness.py", description=__doc__.split("\n\n")[0],
                                epilog="Run the grid first: mpiexec -n 3 fedmpi sweep jobs/sweeps/robustness.yaml")
    p.add_argument("--runs", help="the sweep's folder (default: the spec's out, runs/robustness)")
    p.add_argument("--spec", default=os.path.join(ROOT, SPEC), help=f"the sweep spec (default {SPEC})")
    p.add_argument("--seeds", type=int, nargs="+", help="only these seeds (default: the spec's)")
    p.add_argument("--docs", help="folder of reproduction.md (its robustness section) and robustness.csv (default: "
                                  "the working folder, refused inside the checkout; the published ones: "
                                  "--docs docs/results)")
    args = p.parse_args(argv)
    args.docs = output_or_default(args.docs, "robustness.py", ".", "--docs", ROOT, example="docs/results")
    found = sweep_results.read_for("robustness.py", args.spec, args.runs, args.seeds, ROOT)   # the sweep runs from ROOT
    if found is None:
        return 2
    results, missing = found
    cells = read_cells(results)
    for (partition, attack, aggregator) in cells:
        print(f"{partition:9s} {attack:13s} {aggregator:13s} {cell_text(cells, partition, attack, aggregator)}")
    if not any(r.status == sweep_results.READY for r in results):
        print("robustness.py: no finished run to report; nothing written", file=sys.stderr)
        return 2
    os.makedirs(args.docs, exist_ok=True)
    write_csv(cells, os.path.join(args.docs, "robustness.csv"))
    text = section(cells, results, missing)
    insert(os.path.join(args.docs, "reproduction.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
