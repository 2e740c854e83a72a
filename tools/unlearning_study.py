#!/usr/bin/env python3
"""Federated unlearning of one client: the exact baseline (the run retrained without it, which differs from the
original in that client alone) against FedEraser's calibrated replay of the original's recorded updates
(docs/how-to/counterfactuals.md).

    mpiexec -n 3 fedmpi run CONFIG.yaml checkpoint.updates=true            # the original, its updates recorded
    python tools/unlearning_study.py ORIGINAL --forget 7 --out DIR [--every 1,2] [--ratio 0.5,1] [--np 3]

Both unlearned models are made by one `fedmpi sweep` launch (DIR/runs: `retrain`, `federaser`; a launch started
again keeps what finished). The table (DIR/unlearning.md, .csv) gives, for the original, the exact retrain and
FedEraser: the model's L2 distance to the exact retrain, test accuracy, accuracy on the forgotten client's
training data and on the other clients', the rounds and local steps the unlearning cost and its round-loop
seconds. FedEraser replays every `--every`-th round with `--ratio` of the local steps (Liu et al. 2021 use
every 2nd round and half the epochs).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import yaml

from fedmpi.core.errors import FedmpiError, InputError
from fedmpi.core.tool_outputs import OneLineParser, ToolUsageError, output_or_default

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(argv):
    p = OneLineParser(prog="tools/unlearning_study.py", description=__doc__.split("\n\n")[0])
    p.add_argument("original", help="the original run's folder (recorded with checkpoint.updates=true)")
    p.add_argument("--forget", type=int, required=True, help="the client to unlearn")
    p.add_argument("--out", help="folder of the runs and the table (default ./runs/unlearning-study; refused inside "
                                 "the checkout)")
    p.add_argument("--every", default="2", help="FedEraser: replay every this many rounds; several, comma-separated, "
                                                "give one FedEraser row each (default 2)")
    p.add_argument("--ratio", default="0.5", help="FedEraser: share of the local steps; several, comma-separated, "
                                                  "give a row for each with each --every (default 0.5)")
    p.add_argument("--np", type=int, default=3, help="ranks of the launch (default 3; 1: in this process)")
    args = p.parse_args(argv)
    args.out = output_or_default(args.out, "tools/unlearning_study.py", os.path.join("runs", "unlearning-study"),
                                 "--out", ROOT)
    try:
        args.every = sorted({int(x) for x in args.every.split(",") if x.strip()})
        args.ratio = sorted({float(x) for x in args.ratio.split(",") if x.strip()})
    except ValueError:
        raise ToolUsageError(f"--every {args.every!r} --ratio {args.ratio!r}: expected round counts and shares, "
                             f"e.g. --every 1,2 --ratio 0.5,1") from None
    if not args.every or not args.ratio or min(args.every) < 1 or not all(0 < r <= 1 for r in args.ratio):
        raise ToolUsageError(f"--every {args.every} --ratio {args.ratio}: expected --every >= 1 and 0 < --ratio <= 1")
    return args


def spec(args, cfg):
    """The sweep of the two unlearned models, from the original's stored config `cfg`."""
    steps = cfg.get("client", {}).get("steps")
    if not steps:
        raise InputError(f"{args.original}: its config sets no client.steps; FedEraser's calibration is a share of "
                         f"the local steps (give the original client.steps)")
    forget = {"counterfactual.drop": [args.forget], "counterfactual.of": os.path.abspath(args.original)}
    rounds = int(cfg["rounds"])
    return {"base": "original.yaml", "out": os.path.join(args.out, "runs"), "sets": [{"name": "retrain", **forget}] + [
        {"name": f"federaser-every{every}-ratio{ratio:g}", **forget, "unlearning.method": "federaser",
         "unlearning.original": os.path.abspath(args.original), "unlearning.every": every,
         "rounds": -(-rounds // every), "client.steps": calibration_steps(steps, ratio)}
        for every in args.every for ratio in args.ratio]}


def calibration_steps(steps, ratio) -> int:
    """FedEraser's local steps: `ratio` of the original's, at least one."""
    return max(1, round(steps * ratio))


def launch(args, path):
    """The sweep: in this process at --np 1, else under mpiexec."""
    if args.np == 1:
        from fedmpi.cli import main as fedmpi_main

        if fedmpi_main(["sweep", path]):
            raise InputError(f"fedmpi sweep {path} failed; its index: {os.path.join(args.out, 'runs', 'index.csv')}")
        return
    from fedmpi.analysis.batch_report import require_mpiexec

    mpiexec = os.environ.get("MPIEXEC") or require_mpiexec("tools/unlearning_study.py", "or set MPIEXEC")
    cmd = [mpiexec, "-n", str(args.np), sys.executable, "-m", "fedmpi", "sweep", path]
    if subprocess.run(cmd, cwd=ROOT).returncode:
        raise InputError(f"{' '.join(cmd)} failed; its index: {os.path.join(args.out, 'runs', 'index.csv')}")


def _loop_seconds(folder):
    """(round-loop seconds, rounds) of a finished run."""
    from fedmpi.analysis.report import read_run

    metrics = read_run(os.path.join(folder, "run.h5")).metrics
    return float(metrics["wall_s"][-1]), len(metrics["round"])


def table(args, cfg):
    from fedmpi.analysis.model_eval import RunEvaluator, final_vector

    evaluator = RunEvaluator.from_run(args.original)
    others = [c for c in range(evaluator.num_clients) if c != args.forget]
    runs = {"original (not unlearned)": (args.original, 1.0),
            "exact retrain without the client": (os.path.join(args.out, "runs", "retrain"), 1.0)}
    for every in args.every:
        for ratio in args.ratio:
            runs[f"FedEraser (every {every}, {ratio:g} of the steps)"] = (
                os.path.join(args.out, "runs", f"federaser-every{every}-ratio{ratio:g}"), ratio)
    vectors = {name: final_vector(folder) for name, (folder, _) in runs.items()}
    exact = vectors["exact retrain without the client"]
    steps = int(cfg["client"]["steps"])
    per_round = int(cfg["server"]["clients_per_round"])
    rows = []
    for name, (folder, ratio) in runs.items():
        vec = vectors[name]
        secs, rounds = _loop_seconds(folder)
        run_steps = calibration_steps(steps, ratio)
        cost = ("(training)" if name.startswith("original")
                else f"{rounds} round{'s' if rounds != 1 else ''}, {rounds * (per_round - 1) * run_steps} local steps")
        rows.append((name, float(np.linalg.norm(vec - exact)), evaluator.evaluate(vec)[1],
                     evaluator.evaluate(vec, [args.forget])[1], evaluator.evaluate(vec, others)[1], cost, secs))
    return rows


def markdown(rows, forget):
    lines = [f"| model | L2 distance to the exact retrain | test accuracy | accuracy on client {forget}'s data | "
             f"accuracy on the other clients' data | unlearning cost | round-loop s |", "|---|---|---|---|---|---|---|"]
    for name, dist, test, forgotten, rest, cost, secs in rows:
        lines.append(f"| {name} | {dist:.3f} | {test:.3f} | {forgotten:.3f} | {rest:.3f} | {cost} | {secs:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    from fedmpi.sweep.counterfactuals import read_original

    try:
        args = parse(argv)
        cfg = read_original(args.original)
        if not 0 <= args.forget < int(cfg["partition"]["clients"]):
            raise ToolUsageError(f"--forget {args.forget}: not a client of the original "
                                 f"(0..{int(cfg['partition']['clients']) - 1})")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "original.yaml"), "w") as fh:
            yaml.safe_dump({k: v for k, v in cfg.items() if k != "out"}, fh, sort_keys=False)
        path = os.path.join(args.out, "unlearning.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(spec(args, cfg), fh, sort_keys=False)
        launch(args, path)
        rows = table(args, cfg)
    except (ToolUsageError, FedmpiError) as e:
        print(f"unlearning_study: {e}", file=sys.stderr)
        return 2
    text = markdown(rows, args.forget)
    with open(os.path.join(args.out, "unlearning.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(args.out, "unlearning.csv"), "w") as fh:
        fh.write("model,distance_to_retrain,test_acc,forgotten_acc,others_acc,cost,round_loop_s\n")
        for r in rows:
            fh.write(",".join(f'"{x}"' if isinstance(x, str) else f"{x:.6g}" for x in r) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
