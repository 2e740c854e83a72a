#!/usr/bin/env python3
"""The README's reproduction report: runs jobs/configs/repro/ on mnist5k and writes a table and a figure.

    python tools/reproduce.py [--rounds R] [--seeds 0 1 2] [--np 3] [--runs runs/repro] [--docs docs]
                              [--target 0.8] [--threads T] [--reuse] [--report-only]

FedAvg on the IID, 2-class and 1-class non-IID splits, then data sharing, FSL, FedSkip and SAFL against
FedAvg on the 1-class split, each config once per seed, all in one `mpiexec -n NP` launch
(tools/run_batch.py). Writes DOCS/reproduction.md (the table as measured, with the command that
regenerates it), DOCS/reproduction.png (mean test accuracy +- one std over the seeds against rounds) and
DOCS/reproduction.csv. ROUNDS, SEEDS (space-separated) and NP in the environment set the defaults of
--rounds, --seeds and --np; ROUNDS=3 gives a quick end-to-end check. --reuse keeps finished runs;
--report-only only rereads the runs.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone

from fedmpi import __version__, analysis, report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "jobs", "configs", "repro")
# (config, label in the table and figure, panel): panel "splits" compares FedAvg across splits,
# panel "methods" compares the methods on the 1-class split.
SETTINGS = (
    ("fedavg_iid", "FedAvg, IID", "splits"),
    ("fedavg_2class", "FedAvg, 2-class non-IID", "splits"),
    ("fedavg_1class", "FedAvg, 1-class non-IID", "splits methods"),
    ("datashare", "Data sharing, 1-class", "methods"),
    ("fsl", "FSL, 1-class", "methods"),
    ("fedskip", "FedSkip, 1-class", "methods"),
    ("safl", "SAFL, 1-class", "methods"),
)


def parse(argv):
    env = os.environ
    p = argparse.ArgumentParser(prog="reproduce.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=int(env["ROUNDS"]) if env.get("ROUNDS") else None,
                   help="rounds per run (default: the configs' 100; env ROUNDS)")
    p.add_argument("--seeds", type=int, nargs="+", default=[int(s) for s in env.get("SEEDS", "0 1 2").split()],
                   help="seeds per config (default 0 1 2; env SEEDS)")
    p.add_argument("--np", type=int, default=int(env.get("NP", 3)), help="MPI ranks (default 3; env NP)")
    p.add_argument("--runs", default=os.path.join(ROOT, "runs", "repro"), help="folder for the runs")
    p.add_argument("--docs", default=os.path.join(ROOT, "docs"), help="folder for the report files")
    p.add_argument("--target", type=float, default=0.8, help="accuracy for the rounds-to-target column")
    p.add_argument("--threads", type=int, help="torch threads per rank (default: cores / ranks)")
    p.add_argument("--reuse", action="store_true", help="keep finished runs of the same length")
    p.add_argument("--report-only", action="store_true", help="do not run, only rebuild the report")
    return p.parse_args(argv)


def command_line(args):
    """The command that regenerates this report (defaults left out)."""
    parts = ["python", "tools/reproduce.py"]
    if args.rounds is not None:
        parts += ["--rounds", str(args.rounds)]
    if args.seeds != [0, 1, 2]:
        parts += ["--seeds", *map(str, args.seeds)]
    if args.np != 3:
        parts += ["--np", str(args.np)]
    return shlex.join(parts)


def run_all(args):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    if not mpiexec:
        raise SystemExit("reproduce.py: no mpiexec found (pip install mpich, or load your MPI)")
    configs = [os.path.join(CONFIGS, f"{name}.yaml") for name, _, _ in SETTINGS]
    overrides = [f"rounds={args.rounds}"] if args.rounds is not None else []
    overrides += [f"runtime.threads={args.threads}"] if args.threads else []
    cmd = [mpiexec, "-n", str(args.np), sys.executable, os.path.join(ROOT, "tools", "run_batch.py"), *configs,
           "--seeds", *map(str, args.seeds), "--out-root", args.runs, "--overwrite",
           *(["--skip-finished"] if args.reuse else []), *overrides]
    print("+", shlex.join(cmd), flush=True)
    code = subprocess.call(cmd, cwd=ROOT)
    if code:
        raise SystemExit(f"reproduce.py: the runs failed (exit {code})")


def load_groups(args):
    """{config name: [runs over the seeds]}; a missing run is an error naming it."""
    groups = {}
    for name, _, _ in SETTINGS:
        paths = [os.path.join(args.runs, f"{name}-seed{s}", "run.h5") for s in args.seeds]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise SystemExit(f"reproduce.py: missing runs: {', '.join(missing)}")
        groups[name] = [report.read_run(p) for p in paths]
    return groups


def table_rows(groups, target):
    rows = []
    for name, label, _ in SETTINGS:
        members = groups[name]
        summary = analysis.group_summary(members, target)
        summary.pop("seeds")
        rows.append({"setting": label, "config": name, **summary})
    return rows


def draw(groups, path):
    plt = analysis.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
    titles = {"splits": "FedAvg: IID vs non-IID splits", "methods": "Methods on the 1-class non-IID split"}
    colors = {label: f"C{i}" for i, (_, label, _) in enumerate(SETTINGS)}    # one colour per setting
    for ax, panel in zip(axes, ("splits", "methods")):
        chosen = {label: groups[name] for name, label, panels in SETTINGS if panel in panels.split()}
        analysis.draw_groups(ax, chosen, "test_acc", "round", colors=colors)
        ax.set_title(titles[panel])
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("test accuracy (mean +- std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(args, rows, groups, figure):
    some = next(iter(groups.values()))[0]
    rounds = len(some.metrics["round"])
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return "\n".join([
        "# Reproduction: FedAvg on non-IID splits and the research algorithms (mnist5k)",
        "",
        f"Regenerate with `{command_line(args)}` ({len(SETTINGS)} configs x {len(args.seeds)} seeds in one MPI "
        f"launch). Measured {when} with fedmpi {some.attrs.get('fedmpi_version', __version__)} on "
        f"{some.attrs.get('hosts', '?')}, {some.attrs.get('world_size', '?')} MPI ranks with "
        f"{some.attrs.get('threads', '?')} torch thread(s) each, {rounds} rounds, seeds "
        f"{', '.join(map(str, args.seeds))}; mean ± sample standard deviation over the seeds.",
        "",
        "Configs: `jobs/configs/repro/` (mnist5k, 20 clients, 10 per round, McMahan's 2NN, local SGD lr 0.05, "
        "batch 10, one epoch). Columns: final accuracy = mean of the last 20 evaluations; rise round = first "
        "round whose 20-evaluation rolling mean reaches 90% of the final accuracy; target round = first round "
        f"with test accuracy ≥ {args.target} (`reached` counts the seeds that got there); emd = sample-weighted "
        "mean earth mover's distance of the clients' label distributions to the whole.",
        "",
        report.format_table(rows, "markdown", left=2),
        "",
        f"![test accuracy against rounds]({os.path.basename(figure)})",
        "",
    ])


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if not args.report_only:
        run_all(args)
    groups = load_groups(args)
    rows = table_rows(groups, args.target)
    os.makedirs(args.docs, exist_ok=True)
    figure = os.path.join(args.docs, "reproduction.png")
    draw(groups, figure)
    report.write_csv(rows, os.path.join(args.docs, "reproduction.csv"))
    text = markdown(args, rows, groups, figure)
    with open(os.path.join(args.docs, "reproduction.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
