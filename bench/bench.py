"""fedmpi's benchmark (issue 8): named workloads through fedmpi at -n 1, 2, 3 and through a plain PyTorch
reference loop, one table.

    python bench/bench.py                      # every workload, -n 1 2 3, the loop at -n 2, the reference
    python bench/bench.py --workloads W2 --ranks 2 3 --rounds 10 --repeats 3
    python bench/bench.py --quick              # smoke test: 2 rounds each, -n 1 and 2
    python bench/bench.py --workloads QS --ranks 3 --repeats 2   # the quickstart at -n 3 against -n 1

QS is the quickstart (jobs/configs/quickstart.yaml, evaluation every round) with one torch thread per rank;
its ratios and limit are against fedmpi at -n 1, not against the reference loop.

Every fedmpi row is a real `mpiexec -n P` launch of `fedmpi run` (through bench/_rank.py, which only
adds each rank's peak memory, CPU seconds and CPU seconds per round) on a generated config. Seconds per
round come from run.h5's `/metrics/wall_s` (the server's clock, cumulative from the first round); the first
round (warm-up, first-touch allocations) is reported apart and the median is over the others, then the
median over repeats. "whole s" is the wall clock of the whole mpiexec process: start-up (imports, data loading,
partitioning), the rounds, the final evaluation, writing run.h5.

The reference ("ref") is the floor on this hardware: one process, torch threads 1, a plain PyTorch loop
(nn.Module, torch.optim.SGD, no flat vector, no MPI, no run file) that does exactly the same work: the same
model and initial weights, data, partition, selected clients, batches (the same (seed, round, client)
streams), SGD steps, FedAvg average and (W3) FSL server step. It reaches the same accuracy to float
tolerance (the `acc` column; asserted in tests/test_bench.py).

Every fedmpi rank runs one torch thread (`runtime.threads: 1`), like the reference and like the figures in
issue 8. The machine the table was made on may be shared: compare ratios in one table, repeat, and read
the "busy s/rnd" column (per round, the CPU seconds of the busiest rank; the reference's CPU seconds),
which other processes inflate far less than wall time. The columns are explained in docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RANK_SCRIPT = Path(__file__).resolve().parent / "_rank.py"

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


# --- fedmpi runs -------------------------------------------------------------------------------------

def mpiexec():
    from fedmpi.analysis.batch_report import find_mpiexec

    found = find_mpiexec()
    if not found:
        sys.exit("bench: mpiexec not found (pip install mpich, or load your site's MPI)")
    return found


def run_fedmpi(cfg_map, n, workdir, timeout=3600, sample_memory=False):
    """One `mpiexec -n n fedmpi run` of `cfg_map`; returns the measured figures. `sample_memory` adds each
    rank's peak PSS and USS (sampled from /proc, at a CPU cost the speed workloads should not pay)."""
    import h5py
    import numpy as np

    workdir = Path(workdir)
    stats_dir = workdir / "stats"
    shutil.rmtree(stats_dir, ignore_errors=True)
    stats_dir.mkdir(parents=True)
    cfg_path = workdir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg_map, sort_keys=False))
    env = {**os.environ, "FEDMPI_BENCH_STATS": str(stats_dir), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if sample_memory:
        env["FEDMPI_BENCH_SAMPLE_MEMORY"] = "1"
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(RANK_SCRIPT), "run", str(cfg_path), "--overwrite"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    whole = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"fedmpi -n {n} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    with h5py.File(Path(cfg_map["out"]) / "run.h5", "r", locking=False) as f:
        m = {k: ds[()] for k, ds in f["metrics"].items()}
        device, dim = str(f.attrs.get("device", "?")), int(f.attrs.get("dim", 0))
        training = int(f.attrs.get("training_ranks", max(n - 1, 1)))
    wall = np.asarray(m["wall_s"], dtype=float)
    ranks = sorted((json.loads(p.read_text()) for p in stats_dir.glob("rank-*.json")), key=lambda s: s["rank"])
    # A round is as long as its busiest rank: CPU seconds, which other processes on the machine inflate far
    # less than wall time.
    busy = [max(r["round_cpu_s"][i] for r in ranks) for i in range(min(len(r["round_cpu_s"]) for r in ranks))]
    acc = m["test_acc"][~np.isnan(m["test_acc"])]
    return {
        "rounds": np.diff(np.concatenate([[0.0], wall])).tolist(),
        "busy_rounds": busy,
        "whole_s": whole,
        "loop_s": float(wall[-1]) if len(wall) else 0.0,
        "acc": float(acc[-1]) if len(acc) else float("nan"),
        "device": device,
        "training_ranks": training,
        "peak_rss_mb": [s["peak_rss_mb"] for s in ranks],
        "peak_pss_mb": [s.get("peak_pss_mb", float("nan")) for s in ranks],
        "peak_uss_mb": [s.get("peak_uss_mb", float("nan")) for s in ranks],
        "cpu_s": sum(s["cpu_s"] for s in ranks),
        "server_cpu_s": ranks[0]["cpu_s"] if ranks and n > 1 else float("nan"),
        "fl_bytes": float(np.nansum(m["bytes_up"]) + np.nansum(m["bytes_down"])),
        "mpi_bytes_per_round": mpi_bytes_per_round(n, dim, cfg_map),
    }


def mpi_bytes_per_round(n, dim, cfg_map):
    """What fedmpi's collectives move per round for a FedAvg-shaped algorithm: the float32 broadcast of
    the model (+ 2 header values) to every other rank and the float64 reduction of (sums, 7 statistics, one
    figure per client, 6 timing figures per rank) from every other rank, plus in evaluated rounds the model's
    broadcast and the evaluation's reduction (a loss per test batch, a count per class; not counted here).
    Nothing moves at -n 1."""
    if n == 1:
        return 0.0
    others, clients = n - 1, cfg_map["partition"]["clients"]
    return others * (4.0 * (dim + 2) + 8.0 * (dim + 7 + clients + 6 * n))


# --- the reference loop -----------------------------------------------------------------------------

def reference(cfg_map, device="cpu"):
    """The plain single-process loop (on `device`: bench/gpu_check.py runs it on the GPU); returns per-round
    seconds and the final accuracy."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    device = torch.device(device)
    from fedmpi import config
    from fedmpi.core import rng
    from fedmpi.core.models import build_model
    from fedmpi.data import load_dataset
    from fedmpi.data.server_set import split_dataset

    cfg = config.from_dict(cfg_map)
    ds = load_dataset(cfg)
    split = split_dataset(cfg, ds)
    parts, server_idx = split.parts, split.server_idx
    rng.seed_torch(cfg.seed, rng.INIT)
    model = build_model(cfg.model, ds.input_shape, ds.num_classes).to(device)
    x_tr, y_tr = torch.from_numpy(ds.x_train).to(device), torch.from_numpy(ds.y_train).to(device)
    x_te, y_te = torch.from_numpy(ds.x_test).to(device), torch.from_numpy(ds.y_test).to(device)
    params = list(model.parameters())
    glob = [p.detach().clone() for p in params]
    c, sizes = cfg.client, np.array([len(p) for p in parts])
    steps = lambda n: c.steps or c.epochs * math.ceil(n / c.batch_size)  # noqa: E731

    def batches(g, n, batch, count):
        out = []
        while len(out) < count:
            perm = g.permutation(n)
            out.extend(perm[i:i + batch] for i in range(0, n, batch))
        return out[:count]

    def sgd(indices, g, batch, count, lr, momentum=0.0, wd=0.0):
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)
        model.train()
        for pos in batches(g, len(indices), batch, count):
            idx = indices[torch.from_numpy(pos).to(device)]
            opt.zero_grad()
            F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()

    def load(vectors):
        with torch.no_grad():
            for p, v in zip(params, vectors):
                p.copy_(v)

    fsl = cfg.algorithm.name == "fsl"
    if fsl:   # the FSL paper's default server schedule (B0 = B, E_s from the sizes, eta0 = sqrt(S) eta K / K0)
        n0, k = len(server_idx), cfg.algorithm
        b0 = k.server_batch_size or c.batch_size
        e0 = k.server_epochs or math.ceil(float(sizes.sum()) / (len(sizes) * n0) * c.epochs)
        k0 = e0 * math.ceil(n0 / b0)
        k_c = c.steps or c.epochs * math.ceil(float(sizes.mean()) / c.batch_size)
        lr0 = k.gamma * (k.server_lr or math.sqrt(cfg.server.clients_per_round) * c.lr * k_c / k0)
        d0 = torch.from_numpy(server_idx).to(device)

    times, cpu, acc = [], [], float("nan")
    for t in range(cfg.rounds):
        t0, c0 = time.monotonic(), time.process_time()
        chosen = rng.select_clients(cfg.seed, t, cfg.partition.clients, cfg.server.clients_per_round)
        sums = [torch.zeros_like(v, dtype=torch.float64) for v in glob]
        weight = 0.0
        for cid in chosen:
            load(glob)
            sgd(torch.from_numpy(parts[cid]).to(device), rng.stream(cfg.seed, rng.CLIENT, t, cid), c.batch_size,
                steps(len(parts[cid])), c.lr, c.momentum, c.weight_decay)
            with torch.no_grad():
                for s, p, v in zip(sums, params, glob):
                    s.add_(p - v, alpha=float(len(parts[cid])))
            weight += len(parts[cid])
        glob = [v + (s * (cfg.server.lr / weight)).to(v.dtype) for v, s in zip(glob, sums)]
        if fsl and cfg.algorithm.gamma > 0:
            load(glob)
            sgd(d0, rng.stream(cfg.seed, rng.SERVER, t), b0, k0, lr0)
            glob = [p.detach().clone() for p in params]
        if (t + 1) % cfg.eval.every == 0 or t + 1 == cfg.rounds:
            load(glob)
            model.eval()
            correct = 0
            with torch.no_grad():
                for i in range(0, len(y_te), cfg.eval.batch_size):
                    j = i + cfg.eval.batch_size
                    correct += int((model(x_te[i:j]).argmax(1) == y_te[i:j]).sum())
            acc = correct / len(y_te)
        times.append(time.monotonic() - t0)
        cpu.append(time.process_time() - c0)
    return {"rounds": times, "busy_rounds": cpu, "acc": acc,
            "global": torch.cat([v.reshape(-1) for v in glob]).cpu().numpy()}


def run_reference(cfg_map, workdir, timeout=3600):
    """The reference loop in its own process (so that its whole-process time counts its imports too)."""
    import resource

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path, out_path = workdir / "config.yaml", workdir / "reference.json"
    cfg_path.write_text(yaml.safe_dump(cfg_map, sort_keys=False))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--reference-worker", str(cfg_path),
                           str(out_path)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    whole = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"reference loop exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out = json.loads(out_path.read_text())
    out.update(whole_s=whole, cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
               server_cpu_s=float("nan"), device="cpu", fl_bytes=float("nan"), mpi_bytes_per_round=0.0)
    return out


def _reference_worker(cfg_path, out_path):
    import resource

    with open(cfg_path) as fh:
        cfg_map = yaml.safe_load(fh)
    out = reference(cfg_map)
    out.pop("global")
    out["peak_rss_mb"] = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0]
    out["loop_s"] = sum(out["rounds"])
    Path(out_path).write_text(json.dumps(out))


# --- the table ---------------------------------------------------------------------------------------

def summarize(samples, per_round):
    """Medians over repeats of: later rounds' median, first round, whole process, CPU seconds."""
    med = statistics.median
    later = [med(s["rounds"][1:]) if len(s["rounds"]) > 1 else s["rounds"][0] for s in samples]
    busy = [med(s["busy_rounds"][1:]) if len(s["busy_rounds"]) > 1 else s["busy_rounds"][0] for s in samples]
    first = samples[0]
    return {
        "s_round": med(later), "spread": (min(later), max(later)), "busy_round": med(busy),
        "first_s": med(s["rounds"][0] for s in samples),
        "whole_s": med(s["whole_s"] for s in samples),
        "cpu_s": med(s["cpu_s"] for s in samples),
        "server_cpu_s": med(s["server_cpu_s"] for s in samples),
        "clients_s": per_round / med(later),
        "rss": max(max(s["peak_rss_mb"]) for s in samples),
        "rss_ranks": first["peak_rss_mb"],
        "acc": first["acc"], "device": first["device"],
        **({"training_ranks": first["training_ranks"]} if "training_ranks" in first else {}),
        "mpi_mb": first["mpi_bytes_per_round"] / 1e6,
        "fl_mb": first["fl_bytes"] / 1e6 / max(len(first["rounds"]), 1),
    }


HEADER = ("workload", "run", "s/round", "(min-max)", "x ref", "limit", "eff", "busy s/rnd", "x ref", "1st s",
          "whole s", "cpu s", "rank 0 cpu", "clients/s", "peak MB/rank", "MPI MB/rnd", "FL MB/rnd", "device", "acc")


def _mb(value):
    return "-" if math.isnan(value) else f"{value:.3g}"


def format_row(workload, label, s, ref):
    """One table row. `limit` is the best a run can do: the reference's seconds per round shared by the
    ranks that train (`training_ranks` of run.h5: P - 1, or P where rank 0 hosts clients too); `eff` is that
    limit over the measured seconds per round (1.00 = at the limit)."""
    ratio = s["s_round"] / ref["s_round"] if ref else float("nan")
    busy_ratio = s["busy_round"] / ref["busy_round"] if ref else float("nan")
    limit = ref["s_round"] / s["training_ranks"] if ref and "training_ranks" in s else float("nan")
    efficiency = limit / s["s_round"] if not math.isnan(limit) else float("nan")
    rss = "/".join(f"{r:.0f}" for r in s["rss_ranks"])
    server = "-" if math.isnan(s["server_cpu_s"]) else f"{s['server_cpu_s']:.1f}"
    return (workload, label, f"{s['s_round']:.4f}", f"{s['spread'][0]:.3f}-{s['spread'][1]:.3f}", f"{ratio:.2f}",
            _mb(limit), "-" if math.isnan(efficiency) else f"{efficiency:.2f}",
            f"{s['busy_round']:.4f}", f"{busy_ratio:.2f}", f"{s['first_s']:.2f}", f"{s['whole_s']:.1f}",
            f"{s['cpu_s']:.1f}", server, f"{s['clients_s']:.0f}", rss, _mb(s["mpi_mb"]), _mb(s["fl_mb"]),
            s["device"], f"{s['acc']:.4f}")


def print_table(rows, header=HEADER, left=2, file=sys.stdout):
    """A fixed-width table: the first `left` columns left-aligned (names), the rest right-aligned (figures)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(v).rjust(w) if i >= left else str(v).ljust(w)  # noqa: E731
                               for i, (v, w) in enumerate(zip(r, widths)))
    print(line(header), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for r in rows:
        print(line(r), file=file)
    file.flush()


def _load(name):
    """bench/NAME.py as a module (the workloads kept in files of their own)."""
    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"fedmpi_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _w4():
    spec = importlib.util.spec_from_file_location("fedmpi_bench_w4", Path(__file__).resolve().parent / "w4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=[*WORKLOADS, "QS", "W4", "W6"],
                   choices=[*WORKLOADS, "QS", "W4", "W6"],
                   help="W1 W2 W3 (against the reference), QS (the quickstart, evaluation every round, against "
                        "fedmpi at -n 1), W4 (cross-device scale, bench/w4.py; at -n 2 and 3 of --ranks) and W6 "
                        "(a round's fixed cost at -n 2 to 17 and its fitted scaling law, bench/w6.py); "
                        "default all")
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 3], help="fedmpi -n values (default 1 2 3)")
    p.add_argument("--loop-ranks", nargs="*", type=int, default=[2],
                   help="-n values also run with client.vectorize=off, the per-client loop (default 2)")
    p.add_argument("--rounds", type=int, help="override every workload's round count (shorter runs)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each row, interleaved (every row once, then again); the table shows medians")
    p.add_argument("--vectorize", default="auto", choices=["auto", "on", "off"],
                   help="client.vectorize of the main fedmpi rows (default auto)")
    p.add_argument("--no-reference", action="store_true", help="skip the reference loop")
    p.add_argument("--quick", action="store_true", help="smoke test: 2 rounds, -n 1 and 2, one repeat")
    p.add_argument("--out", default=None, help="folder for run files (default: a temporary folder)")
    p.add_argument("--json", help="also write every measurement to this JSON file")
    p.add_argument("--w4-scale", type=float, default=1.0,
                   help="W4's client counts times this (a smoke test of its plumbing; default 1)")
    p.add_argument("--reference-worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reference_worker:
        _reference_worker(*args.reference_worker)
        return 0
    if args.quick:
        args.rounds, args.repeats = args.rounds or 2, 1
        if args.ranks == [1, 2, 3]:
            args.ranks = [1, 2]
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="fedmpi-bench-"))
    print(f"fedmpi bench: workloads {' '.join(args.workloads)}, -n {' '.join(map(str, args.ranks))}, "
          f"repeats {args.repeats}, rounds {args.rounds or 'as defined'}, cores {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.1f}; runs in {base}", flush=True)
    rows, record = [], {}
    for wl in [w for w in args.workloads if w not in ("W4", "W6")]:
        # (label, -n or None for the reference loop, client.vectorize, is the baseline of the ratios)
        if wl == "QS":      # against fedmpi itself at -n 1: evaluation every round is the point
            plan = [("-n 1", 1, args.vectorize, True)] + [(f"-n {n}", n, args.vectorize, False)
                                                           for n in args.ranks if n > 1]
        else:
            plan = [] if args.no_reference else [("ref", None, None, True)]
            plan += [(f"-n {n}", n, args.vectorize, False) for n in args.ranks]
            plan += [(f"-n {n} loop", n, "off", False) for n in args.loop_ranks
                     if not (args.vectorize == "off" and n in args.ranks)]
        per_round = (quickstart_config("-", None) if wl == "QS" else WORKLOADS[wl])["server"]["clients_per_round"]
        samples = {label: [] for label, *_ in plan}
        for rep in range(args.repeats):      # interleaved, so that a change in the machine's load hits every row
            for label, n, mode, _ in plan:
                work = base / wl / label.replace(" ", "").replace("-", "") / f"r{rep}"
                cfg = (quickstart_config(work / "out", args.rounds, mode) if wl == "QS"
                       else workload_config(wl, work / "out", args.rounds, mode or "auto"))
                sample = run_reference(cfg, work) if n is None else run_fedmpi(cfg, n, work)
                samples[label].append(sample)
                print(f"  {wl} {label} #{rep + 1}: {statistics.median(sample['rounds'][1:] or sample['rounds']):.4f} "
                      f"s/round, whole {sample['whole_s']:.1f} s, acc {sample['acc']:.4f}", flush=True)
        ref = None
        for label, _n, _, baseline in plan:
            s = summarize(samples[label], per_round)
            ref = s if baseline else ref
            record[f"{wl} {label}"] = {"summary": s, "samples": samples[label]}
            rows.append(format_row(wl, label, s, ref))
    if rows:
        print()
        print_table(rows)
    if "W4" in args.workloads:
        w4 = _w4()
        ranks = tuple(n for n in args.ranks if n >= 2) or w4.W4_RANKS
        parts = types.SimpleNamespace(_merge=_merge, _COMMON=_COMMON, workload_config_from=workload_config_from,
                                      run_fedmpi=run_fedmpi)
        w4_rows, record["W4"] = w4.run(parts, base / "W4", args.rounds, ranks, scale=args.w4_scale)
        print()
        print_table(w4_rows, w4.HEADER, left=3)
        print(f"W4: a rank's peak memory beyond its share of the data set (PSS - data/P) is at most "
              f"{w4.expected_overhead_note(w4_rows)} MB")
    if "W6" in args.workloads:
        record["W6"] = _load("w6").main(["--out", str(base / "W6")] + (["--quick"] if args.quick else []))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=float))
    if not args.out:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
