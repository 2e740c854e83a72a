#!/usr/bin/env python3
"""The robustness study (issue 25, item 5): FedAvg against robust aggregators under attacks, on mnist5k.

    python tools/robustness.py [--seeds 0 1 2] [--rounds 20] [--docs docs] [--only-fedavg]

Grid: 2 partitions (IID, Dirichlet(0.1)) x 7 attacks (none, label flip, sign flip, sign flip x4, ALIE with
its z_max and with z = 1, backdoor) x 5 aggregators (FedAvg = the plain weighted mean, coordinate-wise median,
trimmed mean, Krum, FLTrust) x the seeds, every run in this process (fedmpi.simulate: one rank, the same
numbers as any -n).
Setting: mnist5k, 20 clients, 10 per round, 20 rounds, multinomial logistic regression (model lr), client
lr 0.05, batch 20, 1 epoch, 20% malicious clients (4 of 20, drawn from the seed). Figures: test accuracy
and backdoor accuracy as the mean over the last 10% of rounds (the last 2), mean ± sample std over seeds.

Writes DOCS/robustness.csv (one row per partition, attack and aggregator) and the section between
`<!-- robustness -->` and `<!-- /robustness -->` of DOCS/reproduction.md, and prints it. An aggregator or
attack this checkout cannot run (server.aggregator unknown, an omniscient attack refused) is a cell
"refused" with the reason printed once; the claims are judged only on cells that ran.
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import re
import sys
import time
from datetime import datetime, timezone

import numpy as np

import fedmpi
from fedmpi import __version__
from fedmpi.analysis import figures
from fedmpi.core.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHANCE = 0.1            # mnist: ten classes
TAIL = 0.1              # figures: the mean over the last 10% of rounds

BASE = {
    "seed": 0, "rounds": 20, "out": "unused",
    "data": {"name": "mnist5k"},
    "partition": {"clients": 20, "scheme": "iid"},
    "model": {"name": "lr"},
    "client": {"lr": 0.05, "batch_size": 20, "epochs": 1},
    "server": {"clients_per_round": 10},
    "algorithm": {"name": "fedavg"},
    "eval": {"every": 1},
    "runtime": {"threads": 1, "progress": "off"},
}
PARTITIONS = {"IID": {"scheme": "iid"}, "Dir(0.1)": {"scheme": "dirichlet", "beta": 0.1}}
ATTACKS = {
    "no attack": {"name": "none"},
    "label flip": {"name": "label_flip", "fraction": 0.2},
    "sign flip": {"name": "sign_flip", "fraction": 0.2},
    "sign flip x4": {"name": "sign_flip", "fraction": 0.2, "scale": 4.0},
    "ALIE": {"name": "alie", "fraction": 0.2},
    "ALIE z=1": {"name": "alie", "fraction": 0.2, "z": 1.0},
    "backdoor": {"name": "backdoor", "fraction": 0.2, "target": 0, "poison_fraction": 0.5, "trigger_size": 3},
}
# server.aggregator of each column, and the keys it needs beside it (FLTrust: the server's root set)
AGGREGATORS = {
    "FedAvg": {},
    "median": {"server": {"aggregator": "median"}},
    "trimmed mean": {"server": {"aggregator": "trimmed_mean"}},
    "Krum": {"server": {"aggregator": "krum"}},
    "FLTrust": {"server": {"aggregator": "fltrust"}, "server_data": {"size": 100}},
}
CLAIMS = {
    "no attack": "defenses lose accuracy under strong label skew (Karimireddy et al. 2022; Li et al. 2023)",
    "label flip": "20% label flippers cost FedAvg little (Tolpegin et al. 2020)",
    "sign flip": "FedAvg breaks under sign flip (Blanchard et al. 2017); robust rules hold",
    "sign flip x4": "FedAvg breaks under sign flip (Blanchard et al. 2017); robust rules hold",
    "ALIE": "ALIE evades median and Krum (Baruch et al. 2019)",
    "ALIE z=1": "ALIE evades median and Krum (Baruch et al. 2019)",
    "backdoor": "robust rules do not stop a backdoor (Bagdasaryan et al. 2020; Sun et al. 2019)",
}


def config_for(partition, attack, aggregator, seed, rounds):
    cfg = copy.deepcopy(BASE)
    cfg["seed"], cfg["rounds"] = seed, rounds
    cfg["partition"].update(PARTITIONS[partition])
    cfg["attack"] = dict(ATTACKS[attack])
    for section, keys in AGGREGATORS[aggregator].items():
        cfg.setdefault(section, {}).update(keys)
    return cfg


def tail_mean(values):
    """The figure's mean over the last 10% of rounds (fedmpi.analysis.figures: backdoor_acc_tail10's definition)."""
    return figures.tail_mean(np.asarray(values, dtype=np.float64), TAIL)


def run_cell(partition, attack, aggregator, seeds, rounds):
    """{'acc': [per seed], 'backdoor': [...]} or {'refused': reason}."""
    accs, bds = [], []
    for seed in seeds:
        try:
            result = fedmpi.simulate(config_for(partition, attack, aggregator, seed, rounds))
        except ConfigError as e:
            return {"refused": " ".join(str(e).split())}
        accs.append(tail_mean(result.metrics["test_acc"]))
        bds.append(tail_mean(result.metrics["backdoor_acc"]) if "backdoor_acc" in result.metrics else np.nan)
    return {"acc": accs, "backdoor": bds}


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


def pts(x):
    return f"{100 * x:.1f}%"


# --- the claims, judged on the measured cells --------------------------------------------------------------

def verdicts(cells):
    """[(holds: True/False/None, claim, evidence)] from the measured cells (None: not measured here)."""
    out = []
    for attack in ("sign flip", "sign flip x4"):
        for partition in PARTITIONS:
            clean, hit = acc(cells, partition, "no attack", "FedAvg"), acc(cells, partition, attack, "FedAvg")
            # "breaks": less than half of the clean accuracy above chance is left
            holds = None if math.isnan(hit) else bool(hit - CHANCE < 0.5 * (clean - CHANCE))
            out.append((holds, f"FedAvg breaks under {attack} ({partition}; breaks = under half of its clean "
                               f"accuracy above chance left)",
                        f"FedAvg {pts(hit)} under attack vs {pts(clean)} without"))
    for attack in ("ALIE", "ALIE z=1"):
        for aggregator in ("median", "Krum"):
            for partition in PARTITIONS:
                clean, hit = acc(cells, partition, "no attack", aggregator), acc(cells, partition, attack, aggregator)
                holds = None if math.isnan(hit) or math.isnan(clean) else bool(clean - hit >= 0.05)
                out.append((holds, f"{attack} evades {aggregator} ({partition}; evades = costs it >= 5 points)",
                            f"{aggregator} {pts(hit)} under {attack} vs {pts(clean)} without"))
    for aggregator in [a for a in AGGREGATORS if a != "FedAvg"]:
        skew = acc(cells, "Dir(0.1)", "no attack", "FedAvg") - acc(cells, "Dir(0.1)", "no attack", aggregator)
        iid = acc(cells, "IID", "no attack", "FedAvg") - acc(cells, "IID", "no attack", aggregator)
        holds = None if math.isnan(skew) else bool(skew >= 0.02 and skew > iid)
        out.append((holds, f"{aggregator} loses accuracy under strong label skew without attack (loses = >= 2 "
                           f"points below FedAvg at Dir(0.1), more than at IID)",
                    f"gap to FedAvg {100 * skew:+.1f} points at Dir(0.1), {100 * iid:+.1f} at IID"
                    if not math.isnan(skew) else "not measured"))
    for partition in PARTITIONS:
        clean, hit = acc(cells, partition, "no attack", "FedAvg"), acc(cells, partition, "label flip", "FedAvg")
        holds = None if math.isnan(hit) else bool(clean - hit < 0.05)
        out.append((holds, f"20% label flippers cost FedAvg little ({partition}; little = < 5 points)",
                    f"FedAvg {pts(hit)} under label flip vs {pts(clean)} without"))
    for aggregator in [a for a in AGGREGATORS if a != "FedAvg"]:
        rates = [bd(cells, p, "backdoor", aggregator) for p in PARTITIONS]
        holds = None if all(math.isnan(r) for r in rates) else bool(np.nanmin(rates) >= 0.5)
        out.append((holds, f"{aggregator} does not stop the backdoor (backdoor accuracy >= 50% at both splits)",
                    "backdoor accuracy " + ", ".join(f"{p} {pts(r)}" for p, r in zip(PARTITIONS, rates))))
    return out


# --- output ----------------------------------------------------------------------------------------------

def cell_text(cells, partition, attack, aggregator):
    cell = cells[(partition, attack, aggregator)]
    if "refused" in cell:
        return "refused"
    m, s = mean_std(cell["acc"])
    text = f"{m:.3f} ± {s:.3f}"
    if attack == "backdoor":
        b, bs = mean_std(cell["backdoor"])
        text += f" (bd {b:.3f} ± {bs:.3f})"
    return text


def section(cells, args, wall, refusals):
    head = ["split", "attack", *AGGREGATORS, "published claim"]
    lines = ["<!-- robustness -->", "## Robustness: FedAvg and robust aggregators under attack (issue 25)", "",
             "Setting (tools/robustness.py): mnist5k, 20 clients, 10 per round, "
             f"{args.rounds} rounds, model lr (multinomial logistic regression), client lr 0.05, batch 20, 1 "
             "epoch; 20% of the clients malicious (4 of 20, drawn from the seed); IID and Dirichlet(0.1) "
             "label skew. Attacks: label flip l -> 9-l; sign flip -Delta and -4 Delta; ALIE (z from n and the "
             "malicious count: about 0.25 when 2 of 10 are malicious; and z = 1); backdoor: 3x3 bright patch, "
             "target 0, half of each malicious batch, no "
             "boost. FLTrust's root set: 100 server images (server_data.size). Cells: test accuracy, the mean "
             "of the last 10% of rounds, mean ± std over seeds "
             f"{', '.join(map(str, args.seeds))}; backdoor rows add the backdoor accuracy (bd: triggered "
             "non-target test images classified as 0). "
             f"Measured {datetime.now(timezone.utc):%Y-%m-%d} with fedmpi {__version__}, one process, "
             f"{sum(len(c.get('acc', ())) for c in cells.values())} runs in {wall / 60:.1f} minutes. Regenerate: "
             "`python tools/robustness.py` (writes docs/robustness.csv).", "",
             "| " + " | ".join(head) + " |", "| " + " | ".join([":--", ":--"] + ["--:"] * len(AGGREGATORS)
                                                               + [":--"]) + " |"]
    for partition in PARTITIONS:
        for attack in ATTACKS:
            row = [partition, attack] + [cell_text(cells, partition, attack, a) for a in AGGREGATORS]
            lines.append("| " + " | ".join(row + [CLAIMS[attack]]) + " |")
    lines += ["", "Claims, judged on these numbers:", ""]
    for holds, claim, evidence in verdicts(cells):
        if holds is None:
            lines.append(f"- **not measured**: {claim} (its cells did not run on this checkout).")
            continue
        lines.append(f"- **{'holds' if holds else 'does not hold'}**: {claim}. Measured: {evidence}.")
    if refusals:
        by_reason = {}
        for what, why in refusals.items():
            by_reason.setdefault(why, []).append(what)
        lines += ["", "Refused on this checkout (not run):", ""]
        lines += [f"- {'; '.join(sorted(whats))}: {why}" for why, whats in by_reason.items()]
    lines.append("<!-- /robustness -->")
    return "\n".join(lines)


def write_csv(cells, path):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["split", "attack", "aggregator", "seeds", "test_acc", "test_acc_std", "backdoor_acc",
                    "backdoor_acc_std", "refused"])
        for (partition, attack, aggregator), cell in cells.items():
            if "refused" in cell:
                w.writerow([partition, attack, aggregator, 0, "", "", "", "", cell["refused"]])
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
    p = argparse.ArgumentParser(prog="robustness.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    p.add_argument("--only-fedavg", action="store_true", help="the FedAvg column only (a quick check)")
    args = p.parse_args(argv)
    aggregators = ["FedAvg"] if args.only_fedavg else list(AGGREGATORS)
    cells, refusals = {}, {}
    start = time.time()
    for partition in PARTITIONS:
        for attack in ATTACKS:
            for aggregator in AGGREGATORS:
                if aggregator not in aggregators:
                    cells[(partition, attack, aggregator)] = {"refused": "not run (--only-fedavg)"}
                    continue
                cell = run_cell(partition, attack, aggregator, args.seeds, args.rounds)
                cells[(partition, attack, aggregator)] = cell
                if "refused" in cell:
                    refusals.setdefault(f"{aggregator}, {attack}", cell["refused"])
                print(f"{partition:9s} {attack:13s} {aggregator:13s} {cell_text(cells, partition, attack, aggregator)}"
                      f"  [{time.time() - start:.0f} s]", flush=True)
    wall = time.time() - start
    os.makedirs(args.docs, exist_ok=True)
    write_csv(cells, os.path.join(args.docs, "robustness.csv"))
    text = section(cells, args, wall, refusals)
    insert(os.path.join(args.docs, "reproduction.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
