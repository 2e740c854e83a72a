#!/usr/bin/env python3
"""The personalization reproduction: local-test accuracy of personalized methods on mnist5k.

    mpiexec -n 3 fedmpi sweep jobs/sweeps/personalization.yaml   # the grid's runs (continues where it stopped)
    python tools/personalization.py --csv docs/results/reproduction_personalization.csv [--runs runs/personalization]
                                    [--seeds 0 1 2] [--write-doc]
    python tools/personalization.py --from RUNS... --csv table.csv   # the same table from your own runs

Grid (jobs/sweeps/personalization.yaml, its common setting jobs/configs/grids/personalization.yaml): two
label-skewed splits of mnist5k's 4,000 training samples over 20 clients, each client holding out 20% of its
samples as its own test split (partition.local_test):
  shards2     the pathological split (McMahan et al.): 2 label-sorted shards per client, ~2 classes each
  dir0.1      Dirichlet(0.1) label proportions
and the methods in METHODS (local, FedAvg, FedAvg+FT, FedPer, FedRep, Ditto, APFL, IFCA), each over the seeds.
Every method trains the same 2NN (mlp) with the same client settings; the local evaluation covers all clients
at the last round (eval.local_clients: all), after eval.finetune_steps for FedAvg+FT.
Reported per (split, method): the mean over seeds (± std) of the sample-weighted mean local accuracy
(/metrics/local_acc_mean) and of the mean of the worst 10% of clients (local_acc_worst10), at the last round,
and FedAvg's global model on the global test set for reference.

This script runs nothing. It reads the sweep's finished runs (fedmpi.sweep.results: each run's split and
method are the names of its sets in the spec, its recorded config checked against them) through
fedmpi.analysis; with --from, any runs, grouped by their recorded split and method label. A (split, method)
without a finished run is "—" in the table, and a line names what to run. The table goes to stdout and to
--csv (default ./reproduction_personalization.csv, refused inside the checkout: the published table is
docs/results/reproduction_personalization.csv, named explicitly); the claims of the papers are judged from these
numbers by `claims`
(docs/results/reproduction.md, "Personalized FL").
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import sys

import numpy as np

from fedmpi.core.tool_outputs import output_or_default
from fedmpi.sweep import results as sweep_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join("jobs", "sweeps", "personalization.yaml")
CSV = "reproduction_personalization.csv"     # in the working folder unless --csv names it (fedmpi.core.tool_outputs)
# The grid's setting as the section describes it (jobs/configs/grids/personalization.yaml); a run read
# replaces each by what it recorded (setting_of).
# The claims' three-valued rule (holds, does not hold, not decided with its cause): reproduce_claims.decide.
_claims_spec = importlib.util.spec_from_file_location("reproduce_claims", os.path.join(ROOT, "tools",
                                                                                    "reproduce_claims.py"))
_claims = importlib.util.module_from_spec(_claims_spec)
_claims_spec.loader.exec_module(_claims)
decide = _claims.decide
SETTING = {"clients": 20, "rounds": 30, "per_round": 10, "local_test": 0.2, "hidden": 100, "seeds": (0, 1, 2)}

# The partition keys of each split of the spec (sets.split), to name the split of a run read with --from.
SPLITS = {
    "shards2": {"scheme": "shards", "shards_per_client": 2},
    "dir0.1": {"scheme": "dirichlet", "beta": 0.1},
}
# The table's name of each method of the spec (sets.method), and of the method label (fedmpi.analysis.labels)
# of its runs, for runs read with --from.
METHODS = {"local": "local", "fedavg": "FedAvg", "fedavg_ft": "FedAvg+FT", "fedper": "FedPer", "fedrep": "FedRep",
           "ditto": "Ditto", "apfl": "APFL", "ifca": "IFCA"}
LABELS = {"local": "local", "fedavg": "FedAvg", "fedavg+ft10": "FedAvg+FT", "fedper": "FedPer", "fedrep": "FedRep",
          "ditto": "Ditto", "apfl": "APFL", "ifca": "IFCA"}


def split_of(row):
    """The split a run used, by the grid's names (SPLITS) where it is one of them, else scheme and parameter."""
    partition = {k.split(".", 1)[1]: v for k, v in row.items() if k.startswith("partition.")}
    for name, spec in SPLITS.items():
        if all(partition.get(k) == v for k, v in spec.items()):
            return name
    scheme = partition.get("scheme", "?")
    return scheme + {"dirichlet": f"{partition.get('beta')}", "shards": f"{partition.get('shards_per_client')}",
                     "labels": f"{partition.get('labels_per_client')}"}.get(scheme, "")


def table_from(paths, cells=None):
    """The table's rows from finished runs, read through fedmpi.analysis: one row per (split, method), each
    figure's mean and std over the runs (seeds). `paths`: files, run folders, folders of runs, globs, or Run
    objects; `cells`: {run path: (split, method)} where the sweep's spec names them, else each run's split and
    method come from its recorded config (split_of, LABELS)."""
    from fedmpi import analysis

    df = analysis.runs(paths)
    if not len(df):
        return []
    df = df[df["status"] == "finished"].copy()
    if not len(df):
        return []
    if cells is None:
        df["split"] = [split_of(row) for row in df.to_dict("records")]
        df["label"] = [LABELS.get(m, m) for m in df["method"]]
    else:
        df["split"] = [cells[p][0] for p in df["path"]]
        df["label"] = [cells[p][1] for p in df["path"]]
    figures = {"local_acc_mean": "local_acc", "local_acc_worst10": "worst10", "final_acc": "global_test_acc"}
    summary = analysis.summary(df, by=["split", "label"], figures=list(figures), warn=False)
    rows = []
    for record in summary.to_dict("records"):
        row = {"split": record["split"], "method": record["label"], "seeds": int(record["n"])}
        for name, short in figures.items():
            row[f"{short}_mean"], row[f"{short}_std"] = record[f"{name}_mean"], record[f"{name}_std"]
        rows.append(row)
    return rows


def cell_of(result):
    """(split, method) of a sweep experiment in the table's names."""
    labels = result.experiment.labels
    return labels["split"], METHODS.get(labels["method"], labels["method"])


def sweep_table(results):
    """The table's rows from the sweep's finished runs (fedmpi.sweep.results.read)."""
    done = [r for r in results if r.status == sweep_results.READY]
    return table_from([r.run for r in done], {r.run.path: cell_of(r) for r in done}) if done else []


def setting_of(runs, seeds):
    """SETTING as the runs recorded it (the first run's config; SETTING where there is none)."""
    if not runs:
        return dict(SETTING)
    cfg = runs[0].config
    return {"clients": cfg["partition"]["clients"], "rounds": cfg["rounds"],
            "per_round": cfg["server"]["clients_per_round"], "local_test": cfg["partition"]["local_test"],
            "hidden": cfg["model"].get("hidden", "?"), "seeds": tuple(seeds)}


def lookup(rows, split, label, key="local_acc_mean"):
    """A figure of the row (split, method); NaN where no run of it was read."""
    return next((r[key] for r in rows if r["split"] == split and r["method"] == label), np.nan)


# method -> (the paper's qualitative claim, the row it is compared with, the figure compared)
CLAIMS = {
    "local": ("local-only training is strong when clients hold few classes (FedPer, FedRep, PFLlib's tables)",
              "FedAvg", "local_acc_mean"),
    "FedAvg": ("the reference: the global model on each client's test split", None, None),
    "FedAvg+FT": ("fine-tuning the global model personalizes it (above FedAvg's global model)", "FedAvg",
                  "local_acc_mean"),
    "FedPer": ("a personal head beats the global model on local tests (Arivazhagan et al. 2019)", "FedAvg",
               "local_acc_mean"),
    "FedRep": ("above FedAvg's global model on local tests under label skew (Collins et al. 2021)", "FedAvg",
               "local_acc_mean"),
    "Ditto": ("above FedAvg's global model on local tests under label skew (Li et al. 2021)", "FedAvg",
              "local_acc_mean"),
    "Ditto (worst 10%)": ("improves the worst clients: worst-10% local accuracy above FedAvg's (Li et al. 2021)",
                          "FedAvg", "worst10_mean"),
    "APFL": ("the mixed model beats both the global model and local-only training (Deng et al. 2020)", "FedAvg",
             "local_acc_mean"),
    "IFCA": ("cluster models beat the single global model on local tests (Ghosh et al. 2020)", "FedAvg",
             "local_acc_mean"),
}


def verdict(rows, split, method):
    """(verdict, evidence) of CLAIMS[method] on `split` from the measured means (and their stds)."""
    claim, reference, key = CLAIMS[method]
    label = method.split(" (")[0]
    if reference is None:
        return "—", ""
    std = key.replace("_mean", "_std")
    compared = [label, reference] + (["local"] if label == "APFL" else [])
    means = {n: {"final_acc": lookup(rows, split, n, key), "final_acc_std": lookup(rows, split, n, std)}
             for n in compared}
    mine = means[label]["final_acc"]
    others = [(mine, means[n]["final_acc"], n) for n in compared[1:]]
    if not all(np.isfinite([m, r]).all() for m, r, _ in others):
        return "not run", ""
    evidence = "; ".join(f"{m:.3f} vs {name} {r:.3f}" for m, r, name in others)
    return decide(min(m - r for m, r, _ in others), means), evidence


def claims(rows):
    """(split, method, claim, verdict, evidence) for every claim and split."""
    return [(split, method, CLAIMS[method][0], *verdict(rows, split, method)) for split in SPLITS for method in CLAIMS
            if CLAIMS[method][1] is not None]


def pct(mean, std):
    return "—" if not np.isfinite(mean) else f"{100 * mean:.1f} ± {100 * std:.1f}"


def markdown(rows, wall=None, setting=None, missing=None):
    """The personalization section of docs/results/reproduction.md, from the measured rows (`setting`: setting_of the
    runs; `wall`: their training seconds summed; `missing`: the line naming the runs not there)."""
    st = {**SETTING, **(setting or {})}
    lines = [START, "## Personalized FL: local-test accuracy on mnist5k", "",
             f"Setting: mnist5k, {st['clients']} clients, each holding out {st['local_test']:.0%} of its samples as "
             f"its own test split (`partition.local_test`, stratified); {st['rounds']} rounds, {st['per_round']} "
             f"clients per round; the 2NN (`mlp`, {st['hidden']} hidden units), client SGD lr 0.05, batch 20, 1 "
             f"epoch; seeds {', '.join(map(str, st['seeds']))}. Splits: `shards2`, the pathological split (2 label-"
             "sorted shards per client, about 2 classes each), and `dir0.1`, Dirichlet(0.1) label proportions. "
             "Methods: `local`; `fedavg` (its global model on each client's split); FedAvg+FT "
             "(`eval.finetune_steps: 10`, discarded after the evaluation); `fedper` (the last linear layer "
             "personal); `fedrep` (`head_epochs: 2`); `ditto` (`lam: 0.1`); `apfl` (`alpha: 0.5` fixed); `ifca` "
             "(`k: 2`). All clients are evaluated at the last round (`eval.local_clients: all`).",
             "",
             "Columns: local acc = `/metrics/local_acc_mean` (sample-weighted mean over the clients' test "
             "splits), worst 10% = `local_acc_worst10` (mean of the 2 lowest of 20 clients), global test = the "
             "algorithm's global model on the global test set (`local` has none: x_0); mean ± sample standard "
             "deviation over the seeds, in %. Run and regenerate: `mpiexec -n 3 fedmpi sweep "
             "jobs/sweeps/personalization.yaml`, then `python tools/personalization.py --write-doc --csv "
             "docs/results/reproduction_personalization.csv` (both outputs named: the tool writes into the checkout "
             "only where told)."
             + (f" Training time of all the runs, summed from their run files: {wall / 60:.0f} min." if wall else "")
             + (f" Missing: {missing}." if missing else ""),
             ""]
    head = "| method |" + "".join(f" {s} local acc | {s} worst 10% |" for s in SPLITS) + " global test (dir0.1) |"
    lines += [head, "|" + " --- |" * (2 + 2 * len(SPLITS))]
    for label in METHODS.values():
        cells = "".join(f" {pct(lookup(rows, s, label), lookup(rows, s, label, 'local_acc_std'))} |"
                        f" {pct(lookup(rows, s, label, 'worst10_mean'), lookup(rows, s, label, 'worst10_std'))} |"
                        for s in SPLITS)
        glob = pct(lookup(rows, "dir0.1", label, "global_test_acc_mean"),
                   lookup(rows, "dir0.1", label, "global_test_acc_std"))
        lines.append(f"| {label} |{cells} {glob if label != 'local' else '— (never aggregated)'} |")
    lines += ["", "The papers' claims, judged from the numbers above (holds: the mean is above the compared "
              "row's on that split by more than the seeds' spread, the largest std of the rows compared; does not "
              "hold: below by more than it; otherwise not decided, tied):", "",
              "| method | claim | " + " | ".join(SPLITS) + " |",
              "|" + " --- |" * (2 + len(SPLITS))]
    found = {(split, method): (v, e) for split, method, _, v, e in claims(rows)}
    for method, (claim, reference, _) in CLAIMS.items():
        if reference is None:
            continue
        cells = " | ".join(f"**{found[(s, method)][0]}**: {found[(s, method)][1]}" for s in SPLITS)
        lines.append(f"| {method} | {claim} | {cells} |")
    lines += ["", "Also measured (same runs):", ""]
    for split in SPLITS:
        ditto, ft = lookup(rows, split, "Ditto", "worst10_mean"), lookup(rows, split, "FedAvg+FT", "worst10_mean")
        lines.append(f"- {split}: the worst 10% under Ditto {100 * ditto:.1f}% against FedAvg+FT's {100 * ft:.1f}%: "
                     f"Ditto's gain for the worst clients is over FedAvg's global model, "
                     f"{'and it also beats' if ditto > ft else 'not over'} plain fine-tuning.")
    gl = {m: lookup(rows, "dir0.1", m, "global_test_acc_mean") for m in ("FedAvg", "FedPer", "FedRep", "IFCA")}
    lines.append(f"- dir0.1, the global test set: FedPer's global model {100 * gl['FedPer']:.1f}%, FedRep's "
                 f"{100 * gl['FedRep']:.1f}%, IFCA's cluster 0 {100 * gl['IFCA']:.1f}% against FedAvg's "
                 f"{100 * gl['FedAvg']:.1f}%: FedPer's and FedRep's global model keeps x_0's head (the heads are "
                 f"personal), and IFCA's cluster 0 is trained by the clients that chose it only.")
    lines += ["", END]
    return "\n".join(lines)


START, END = "<!-- extra:personalization -->", "<!-- /extra:personalization -->"
DOC = os.path.join(ROOT, "docs", "results", "reproduction.md")


def write_doc(section, path=DOC):
    """Replaces the personalization block of docs/results/reproduction.md (or appends it)."""
    with open(path) as f:
        text = f.read()
    if START in text and END in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Run the grid first: mpiexec -n 3 fedmpi sweep jobs/sweeps/personalization.yaml")
    p.add_argument("--runs", help="the sweep's folder (default: the spec's out, runs/personalization)")
    p.add_argument("--spec", default=os.path.join(ROOT, SPEC), help=f"the sweep spec (default {SPEC})")
    p.add_argument("--seeds", type=int, nargs="+", help="only these seeds (default: the spec's)")
    p.add_argument("--csv", help=f"the table as CSV (default: ./{CSV}, refused inside the checkout; the published "
                                 f"one: --csv docs/results/{CSV})")
    p.add_argument("--from", dest="runs_from", nargs="+", metavar="RUNS",
                   help="the table from these runs instead (any folder of runs with local evaluation, read through "
                        "fedmpi.analysis: grouped by split and method label); with --csv/--write-doc as usual")
    p.add_argument("--write-doc", action="store_true", help="replace the section in docs/results/reproduction.md")
    args = p.parse_args(argv)
    args.csv = output_or_default(args.csv, "personalization.py", CSV, "--csv", ROOT)   # decided before any work
    wall, setting, missing = None, None, None
    if args.runs_from:
        rows = table_from(args.runs_from)
    else:
        found = sweep_results.read_for("personalization.py", args.spec, args.runs, args.seeds, ROOT)  # run from ROOT
        if found is None:
            return 2
        results, missing = found
        rows = sweep_table(results)
        setting = setting_of(sweep_results.finished(results), sorted({r.seed for r in results}, key=str))
        wall = sweep_results.training_s(results)
    if not rows:
        print("personalization.py: no finished run to report; nothing written", file=sys.stderr)
        return 2
    keys = ["split", "method", "seeds", "local_acc_mean", "local_acc_std", "worst10_mean", "worst10_std",
            "global_test_acc_mean", "global_test_acc_std"]
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.4f}" if isinstance(r[k], float) else r[k]) for k in keys})
    print(f"{'split':8} {'method':10} {'seeds':>5} {'local acc':>15} {'worst 10%':>15} {'global test':>15}")
    for r in rows:
        print(f"{r['split']:8} {r['method']:10} {r['seeds']:>5} "
              f"{r['local_acc_mean']:.3f} ± {r['local_acc_std']:.3f}   {r['worst10_mean']:.3f} ± {r['worst10_std']:.3f}"
              f"   {r['global_test_acc_mean']:.3f} ± {r['global_test_acc_std']:.3f}")
    for split, method, claim, holds, evidence in claims(rows):
        print(f"[{holds}] {split}: {method}: {claim}: {evidence}")
    if args.write_doc:
        write_doc(markdown(rows, wall, setting, missing))
        print(f"wrote the personalization section of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
