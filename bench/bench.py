"""fedmpi's benchmark: named workloads through fedmpi at -n 1, 2, 3 and through a plain PyTorch
reference loop, measured in pairs, one table.

    python bench/bench.py                      # W1-W3, QS, W4, W6; -n 1 2 3, the loop at -n 2, one pair each
    python bench/bench.py --workloads W2 --ranks 2 3 --rounds 10 --pairs 3
    python bench/bench.py --quick              # smoke test: 2 rounds each, -n 1 and 2
    python bench/bench.py --done-when --markdown docs/results/performance.md   # the paired targets' measurement
    python bench/bench.py --workloads SK       # the full Shakespeare build's set-up (bench/shakespeare_setup.py)

Paired (bench/paired.py, bench/pacing.py): every fedmpi run has a run of its baseline (the reference loop,
or for QS fedmpi at -n 1) beside it. By default (`--pace round`) the two are launched together and take
turns a round at a time (A B A B ... round by round), so that round t of each sees the same state of a
shared host, a second apart; a pair's ratio is the median over rounds 2.. of round t's ratio. With `--pace
run` the baseline's whole run comes first, then the row's, and a pair's ratio is that of the runs' medians.
A row's `x base` is the median of its pairs' ratios, with their min-max, and the baseline's row shows the
host's variation (its own runs' spread about their median).

QS is the quickstart (jobs/configs/quickstart.yaml, evaluation every round) with one torch thread per rank,
against fedmpi at -n 1. W5 is pfl-research's CIFAR-10 benchmark setup (bench/w5.py), not in the default set.

Every fedmpi row is a real `mpiexec -n P` launch of `fedmpi run` (through bench/_rank.py, which only
adds each rank's peak memory, CPU seconds and CPU seconds per round, and waits for its turn when paced) on a
generated config. Seconds per round are rank 0's `run_round` (paced; its clock starts after the turn's
wait) or come from run.h5's `/metrics/wall_s` (the server's clock, cumulative from the first round); the
first round (warm-up, first-touch allocations) is reported apart and a run's figure is the median of the
others. "whole s" is the wall clock of the whole mpiexec process (less the time it waited for turns):
start-up (imports, data loading, partitioning), the rounds, the final evaluation, writing run.h5; paced,
the two jobs' start-ups overlap.

The reference ("ref", bench/reference_loop.py) is the floor on this hardware: one process, torch threads 1,
a plain PyTorch loop that does exactly the same work and reaches the same accuracy (the `acc` column;
asserted in tests/test_bench.py). Every fedmpi rank runs one torch thread (`runtime.threads: 1`). The
columns are explained in docs/results/performance.md. Launching and measuring one job is bench/launch.py's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

def _sibling(name):
    """bench/NAME.py as a module (the bench folder is not a package)."""
    key = f"fedmpi_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).resolve().parent / f"{name}.py")
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


reference = _sibling("reference_loop").reference     # the plain PyTorch loop, the floor
pacing = _sibling("pacing")      # round-by-round pairing


# --- workloads --------------------------------------------------------------------------------------

_COMMON = {
    "seed": 0,
    "client": {"lr": 0.05, "batch_size": 10, "epochs": 1},
    "algorithm": {"name": "fedavg"},
    "checkpoint": {"every": 0},
    "runtime": {"threads": 1, "progress": "off"},
}

WORKLOADS = {
    # Compute-bound: McMahan's CNN, 50 IID clients of 80 images (4,000 / 50), 10 per round.
    "W1": {"rounds": 20, "data": {"name": "mnist5k"}, "partition": {"clients": 50, "scheme": "iid"},
           "model": {"name": "cnn_mnist"}, "server": {"clients_per_round": 10}},
    # Many tiny clients, overhead-bound: SYNTHETIC(1,1), 1,000 users of 40 samples, 100 per round.
    "W2": {"rounds": 50, "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0},
           "partition": {"clients": 1000, "scheme": "natural", "samples_per_client": 40},
           "model": {"name": "lr"}, "server": {"clients_per_round": 100}},
    # FSL's many-small-clients scenario: 200 clients of 20 images (2 shards of 10), 50 per round, server
    # learning on a server set of 100 IID images each round.
    "W3": {"rounds": 20, "data": {"name": "mnist5k"},
           "partition": {"clients": 200, "scheme": "shards", "shards_per_client": 2},
           "model": {"name": "cnn2"}, "server": {"clients_per_round": 50},
           "algorithm": {"name": "fsl", "gamma": 1.0}, "server_data": {"size": 100, "scheme": "iid"}},
}


def _merge(base, extra):
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def workload_config(name, out, rounds=None, vectorize="auto", overrides=None):
    """The fedmpi config mapping of workload `name` writing to `out`; evaluation once, after the last round
    (`eval.every = rounds`: the per-round figures measure training rounds, in fedmpi and the reference)."""
    cfg = workload_config_from(_merge(_COMMON, WORKLOADS[name]), out, rounds, vectorize)
    return _merge(cfg, overrides or {})


def workload_config_from(mapping, out, rounds=None, vectorize="auto"):
    """`workload_config` for a workload's mapping (W4's, bench/w4.py)."""
    cfg = dict(mapping)
    if rounds:
        cfg["rounds"] = rounds
    return _merge(cfg, {"out": str(out), "eval": {"every": cfg["rounds"]}, "client": {"vectorize": vectorize}})


def quickstart_config(out, rounds=None, vectorize="auto"):
    """QS: jobs/configs/quickstart.yaml as `make run` runs it (evaluation every round), with the bench's
    common settings (one torch thread per rank, no checkpoints)."""
    mapping = yaml.safe_load((ROOT / "jobs" / "configs" / "quickstart.yaml").read_text())
    mapping = _merge(mapping, {k: v for k, v in _COMMON.items() if k in ("checkpoint", "runtime")})
    cfg = _merge(mapping, {"out": str(out), "client": {"vectorize": vectorize or "auto"}})
    return {**cfg, "rounds": rounds} if rounds else cfg


# --- launching and measuring the jobs (bench/launch.py) ------------------------------------------

launch = _sibling("launch")
mpiexec, Job, start_fedmpi, run_fedmpi = launch.mpiexec, launch.Job, launch.start_fedmpi, launch.run_fedmpi
mpi_bytes_per_round, start_reference, FloorJob = launch.mpi_bytes_per_round, launch.start_reference, launch.FloorJob
run_reference, _reference_worker = launch.run_reference, launch._reference_worker


# --- the table ---------------------------------------------------------------------------------------

def print_table(rows, header=None, left=2, file=sys.stdout):
    """A fixed-width table: the first `left` columns left-aligned (names), the rest right-aligned (figures)."""
    header = header or paired.HEADER
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(v).rjust(w) if i >= left else str(v).ljust(w)  # noqa: E731
                               for i, (v, w) in enumerate(zip(r, widths)))
    print(line(header), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for r in rows:
        print(line(r), file=file)
    file.flush()


# --- one workload, paired ----------------------------------------------------------------------------

def plan_rows(wl, ranks, loop_ranks, vectorize, floor=False):
    """The rows of workload `wl`: (label, -n, client.vectorize), fedmpi's and with `floor` the two-process
    floor ("ref x2": two reference processes, each training half of every round's clients) first. The
    baseline (the reference loop; for QS fedmpi at -n 1) is not among them: it is paired with each."""
    if wl == "QS":
        return [(f"-n {n}", n, vectorize) for n in ranks if n > 1]
    rows = ([("ref x2", FLOOR, "auto")] if floor else []) + [(f"-n {n}", n, vectorize) for n in ranks]
    return rows + [(f"-n {n} loop", n, "off") for n in loop_ranks if not (vectorize == "off" and n in ranks)]


def measure(wl, rows, pairs, base, rounds=None, pace="round", targets=None):
    """Runs workload `wl`'s baseline and rows in pairs (paired.launch_order); returns (table rows, record,
    the host's variation). `pace`: "round", the pair's two jobs side by side taking turns a round at a time
    (bench/pacing.py); "run", the baseline's run, then the row's (the peers' basis). `targets`: the rows'
    bounds (paired.TARGETS, the paired targets, by default)."""
    targets = paired.TARGETS if targets is None else targets
    overrides = PREPARE[wl](base) if wl in PREPARE else {}
    baseline_label = "-n 1" if wl == "QS" else "ref"
    per_round = (quickstart_config("-") if wl == "QS" else WORKLOADS[wl])["server"]["clients_per_round"]
    base_runs, runs = {}, {label: [] for label, *_ in rows}
    order = paired.launch_order(rows, pairs)
    for k in range(0, len(order), 2):
        (_, p), (row, _) = order[k], order[k + 1]
        label = row[0]
        jobs = []
        for j, (lab, n, mode) in enumerate([(baseline_label, 1 if wl == "QS" else None, "auto"), row]):
            work = base / wl / pace / lab.replace(" ", "").replace("-", "") / f"pair{p}-{k + j}"
            cfg = (quickstart_config(work / "out", rounds, mode) if wl == "QS"
                   else workload_config(wl, work / "out", rounds, mode or "auto", overrides))
            jobs.append((cfg, n, work))
        pending, sample = run_pair(jobs, pace)
        base_runs.setdefault(p, []).append(pending)
        runs[label].append((pending, sample))
        for lab, s, other in ((baseline_label, pending, None), (label, sample, pending)):
            print(f"  {wl} {lab} pair {p + 1}: {paired.later_rounds(s['rounds']):.4f} s/round, whole "
                  f"{s['whole_s']:.1f} s, acc {s['acc']:.4f}"
                  + (f", x base {paired.pair_ratio(other, s):.3f}" if other else ""), flush=True)
    every_base = [s for p in sorted(base_runs) for s in base_runs[p]]
    b = paired.summarize_baseline(every_base)
    table = [paired.format_row(wl, baseline_label, b, per_round, is_baseline=True)]
    record = {f"{wl} {baseline_label}": {"summary": b, "samples": every_base}}
    for label, *_ in rows:
        s = paired.summarize_row([a for a, _ in runs[label]], [r for _, r in runs[label]])
        table.append(paired.format_row(wl, label, s, per_round, targets=targets))
        record[f"{wl} {label}"] = {"summary": s, "samples": [r for _, r in runs[label]]}
    print(f"  {wl} {baseline_label}: {b['runs']} runs, {b['s_round']:.4f} s/round, host variation "
          f"{100 * b['variation']:.1f}% (max - min of its runs over their median)", flush=True)
    return table, record, b["variation"]


FLOOR = "floor"      # a row's -n for the two-process floor ("ref x2", FloorJob)


def _start(cfg, n, work, env_extra=None):
    """A fedmpi job at -n n, the reference loop where n is None, the two-process floor where n is FLOOR."""
    if n == FLOOR:
        return FloorJob(cfg, work, env_extra)
    if n:
        return start_fedmpi(cfg, n, work, env_extra=env_extra)
    return start_reference(cfg, work, env_extra=env_extra)


def run_pair(jobs, pace="round", turn_timeout=900):
    """One pair's two runs [(config, -n or None for the reference, folder)], baseline first; returns both
    figures. Paced by round, both jobs are launched at once and take turns, a round each."""
    if pace == "run":
        return [_start(cfg, n, work).wait() for cfg, n, work in jobs]
    turns, launched = [], []
    try:
        for cfg, n, work in jobs:
            work.mkdir(parents=True, exist_ok=True)
            # a FloorJob's two processes both read `go` and both report `done`
            turns.append(pacing.Turns(work / "pace", 2 if n == FLOOR else n or 1, 2 if n == FLOOR else 1))
            launched.append(_start(cfg, n, work, turns[-1].env))
        rounds = jobs[0][0]["rounds"]
        if not pacing.take_turns([(t, job.proc) for t, job in zip(turns, launched)], rounds, turn_timeout):
            for job in launched:
                if job.proc.poll() is not None:
                    job.wait()          # raises the job's failure
            raise RuntimeError(f"a paced job ended before its {rounds} rounds")
        return [{**job.wait(), "paced": True} for job in launched]
    finally:
        for job in launched:
            job.kill()      # (a no-op for a job that has ended; one still waiting for a turn when the other failed)
        for t in turns:
            t.close()


# The paired targets' measurement (--done-when): W1, QS, W2 and W5 at the targets' -n values, 3 pairs each,
# rounds shortened so that the whole measurement takes about 15 minutes on a quiet 2-core machine (medians of
# rounds 2..).
DONE_WHEN = {"W1": ((2, 3), 8), "QS": ((3,), 6), "W2": ((2, 3), 30), "W5": ((2, 3), 4)}
# Where --done-when also measures the two-process floor ("ref x2"): the compute-bound workloads whose
# targets sit near 0.50 of the reference.
FLOOR_WORKLOADS = ("W1", "W5")


paired = _sibling("paired")
_w5 = _sibling("w5")
WORKLOADS["W5"] = _w5.WORKLOAD
# Workloads whose runs need something made first (their data): name -> f(bench folder) -> config overrides.
PREPARE = {"W5": lambda base: {"data": {"root": str(_w5.write_cifar10_like(base / "W5-data"))}}}


markdown = _sibling("markdown")       # --markdown: the marked blocks of docs/results/performance.md
_refuse = markdown.refuse


def main(argv=None):
    everything = [*WORKLOADS, "QS", "W4", "W6", "SK"]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=[w for w in everything if w not in ("W5", "SK")],
                   choices=everything,
                   help="W1 W2 W3 W5 (against the reference), QS (the quickstart, evaluation every round, against "
                        "fedmpi at -n 1), W4 (cross-device scale, bench/w4.py; at -n 2 and 3 of --ranks) and W6 "
                        "(a round's fixed cost at -n 2 to 17 and its fitted scaling law, bench/w6.py), SK (the full "
                        "Shakespeare build's set-up from its JSON and its binary form against the targets 5 s and "
                        "1 GB, bench/shakespeare_setup.py); default all but W5 (pfl-research's CIFAR-10 setup, "
                        "bench/w5.py) and SK")
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 3], help="fedmpi -n values (default 1 2 3)")
    p.add_argument("--loop-ranks", nargs="*", type=int, default=[2],
                   help="-n values also run with client.vectorize=off, the per-client loop (default 2)")
    p.add_argument("--rounds", type=int, help="override every workload's round count (shorter runs)")
    p.add_argument("--pairs", "--repeats", type=int, dest="pairs",
                   help="pairs per fedmpi row: the baseline, then the row, this many times (default 1; 3 with "
                        "--done-when)")
    p.add_argument("--pace", default="round", choices=["round", "run"],
                   help="how a pair's two runs alternate: round (default: side by side, taking turns a round at a "
                        "time, bench/pacing.py) or run (the baseline's whole run, then the row's)")
    p.add_argument("--floor", action="store_true",
                   help="also a row \"ref x2\": two reference processes side by side, each training half of "
                        "every round's clients (the two-process floor of this machine; on with --done-when for "
                        + " and ".join(FLOOR_WORKLOADS) + ")")
    p.add_argument("--vectorize", default="auto", choices=["auto", "on", "off"],
                   help="client.vectorize of the main fedmpi rows (default auto)")
    p.add_argument("--done-when", action="store_true",
                   help="the paired targets' measurement: W1 at -n 2 3, QS at -n 3, W2 at -n 2 3, W5 at -n 2 3, "
                        "3 pairs (--pairs to change), shortened rounds; with the targets' status")
    p.add_argument("--peers-basis", action="store_true",
                   help="the peers'-basis targets' measurement (bench/peers_basis.py): W1 and W5 at -n 2 3 on the "
                        "peers' basis and paced, 3 pairs (--pairs to change), and the large model's memory and cost "
                        "per byte")
    p.add_argument("--large-hidden", type=int, default=9970,
                   help="the large model's hidden width with --peers-basis (default 9970: 100 M parameters)")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 rounds, -n 1 and 2, one pair")
    p.add_argument("--out", default=None, help="folder for run files (default: a temporary folder)")
    p.add_argument("--json", help="also write every measurement to this JSON file")
    p.add_argument("--markdown", nargs="+", metavar="FILE",
                   help="also write the table (markdown) between the markers " + paired.BEGIN + " and "
                        + paired.END + " of each FILE (docs/results/performance.md)")
    p.add_argument("--w4-scale", type=float, default=1.0,
                   help="W4's client counts times this (a smoke test of its plumbing; default 1)")
    p.add_argument("--shakespeare", default="/tmp/shakespeare-full",
                   help="SK's build folder, built there where missing (default /tmp/shakespeare-full; with --quick a "
                        "0.2%% build in the run folder)")
    p.add_argument("--reference-worker", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--share", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reference_worker:
        _reference_worker(*args.reference_worker, share=tuple(args.share) if args.share else None)
        return 0
    if args.pairs is None:
        args.pairs = 3 if args.done_when or args.peers_basis else 1
    if args.pairs < 1:
        _refuse(f"--pairs must be at least 1, got {args.pairs}")
    marks = _sibling("peers_basis").MARKS if args.peers_basis else (paired.BEGIN, paired.END)
    docs = markdown.targets(args.markdown, *marks)
    if args.quick:
        args.rounds, args.pairs = args.rounds or 2, 1
        if args.ranks == [1, 2, 3]:
            args.ranks = [1, 2]
    if args.done_when:
        plan = [(wl, plan_rows(wl, ranks, [], args.vectorize, wl in FLOOR_WORKLOADS), args.rounds or rounds)
                for wl, (ranks, rounds) in DONE_WHEN.items()]
    else:
        plan = [(wl, plan_rows(wl, args.ranks, args.loop_ranks, args.vectorize, args.floor), args.rounds)
                for wl in args.workloads if wl not in ("W4", "W6", "SK")]
    # Absolute: the launches run with the checkout as their working folder.
    base = Path(args.out).resolve() if args.out else Path(tempfile.mkdtemp(prefix="fedmpi-bench-"))
    if args.peers_basis:
        print(f"fedmpi bench: the peers'-basis targets' measurement, pairs {args.pairs}, cores {os.cpu_count()}, load "
              f"{os.getloadavg()[0]:.1f}; runs in {base}", flush=True)
        table = lambda rows: paired.markdown_table(paired.MARKDOWN_HEADER, paired.markdown_rows(rows))  # noqa: E731
        parts = types.SimpleNamespace(measure=measure, plan_rows=plan_rows, print_table=print_table, sibling=_sibling,
                                      run_fedmpi=run_fedmpi, markdown=table, when=markdown.when)
        record = _sibling("peers_basis").run(parts, base, args.pairs, args.rounds, args.large_hidden)
        markdown.write(docs, record.pop("markdown").replace("COMMAND", _command(argv)), *marks)
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=1, default=float))
        if not args.out:
            shutil.rmtree(base, ignore_errors=True)
        return 0
    print(f"fedmpi bench: workloads {' '.join(wl for wl, *_ in plan) or '-'}, pairs {args.pairs}, cores "
          f"{os.cpu_count()}, load {os.getloadavg()[0]:.1f}; runs in {base}", flush=True)
    rows, record, variation = [], {}, {}
    for wl, wl_rows, rounds in plan:
        table, rec, variation[wl] = measure(wl, wl_rows, args.pairs, base, rounds, args.pace)
        rows += table
        record.update(rec)
    if rows:
        print()
        print_table(rows)
        print("x base: the median over pairs of (run / its pair's baseline) in seconds per round, (min-max) "
              "beside it; for a baseline row, its runs' spread about their median (the host's variation)")
    if docs or args.done_when:
        markdown.write(docs, markdown.paired_block(rows, variation, _command(argv), args.pace))
    if "W4" in args.workloads and not args.done_when:
        w4 = _sibling("w4")
        ranks = tuple(n for n in args.ranks if n >= 2) or w4.W4_RANKS
        parts = types.SimpleNamespace(_merge=_merge, _COMMON=_COMMON, workload_config_from=workload_config_from,
                                      run_fedmpi=run_fedmpi)
        w4_rows, record["W4"] = w4.run(parts, base / "W4", args.rounds, ranks, scale=args.w4_scale)
        print()
        print_table(w4_rows, w4.HEADER, left=3)
        print(f"W4: a rank's peak memory beyond its share of the data set (PSS - data/P) is at most "
              f"{w4.expected_overhead_note(w4_rows)} MB")
    if "W6" in args.workloads and not args.done_when:
        record["W6"] = _sibling("w6").main(["--out", str(base / "W6")] + (["--quick"] if args.quick else []))
    if "SK" in args.workloads and not args.done_when:
        sk = (["--data", str(base / "SK-data"), "--fraction", "0.002", "--repeats", "1"] if args.quick else
              ["--data", args.shakespeare, "--repeats", str(max(args.pairs, 3))])
        print()
        record["SK"] = _sibling("shakespeare_setup").main(sk + ["--ranks", *map(str, args.ranks)])
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=float))
    if not args.out:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def _command(argv):
    return "python bench/bench.py " + " ".join(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
