"""A node's memory with a LoRA-adapted causal language model (model.name: causal_lm): each rank's proportional
set size (PSS: a page shared by k processes counts 1/k) and private memory (USS) after every round, at -n 1 and
-n 3 on the same config, beside the frozen base's and the adapters' bytes. At -n 3 the frozen base lives once
in the node's shared window (fedmpi.core.shared_base), so a rank's PSS holds a third of it; the per-process
runtime (Python, torch, MPI: a few hundred MB each) is counted as it is, its shared libraries split like the base.

The figures are read in the rank itself right after set-up (`setup_*`: the model built and shared, nothing
trained) and after each round (the run loop's `fedmpi.round.engine.run_round`, wrapped here; the last round's
is printed), when the round's activations are freed, each after glibc's malloc_trim; `peak_rss_mb` is the
kernel's peak resident set, which includes the moment at start-up when every rank holds its whole base before
the sharing frees it.

    python bench/lora_memory.py [--layers 6 --width 576] [--ranks 1 3] [--rounds 2] [--private]

It makes a GPT-2 of `layers` x `width` (6 x 576: 24 M parameters) over LEAF Shakespeare-shaped test files
(random characters: memory does not depend on the text), trains rank-8 adapters with FedAvg, and prints one
JSON line per -n: each rank's figures, their sum over the node, and the ratio of the node at -n 3 to -n 1;
with --private also each -n > 1 with the sharing switched off (every rank keeping its own base). Each rank also
reads its PSS right before set-up loads the data and builds the model (`runtime_pss_mb`: Python, torch,
transformers, peft, MPI), so what the model adds is told apart from the runtime every process carries.

Measured on a quiet 2-core virtual machine (`python bench/lora_memory.py --private`, 45 s; base 91.7 MiB,
adapters 0.42 MiB): what data and model add to the node 124 MB at -n 1, 154 MB at -n 3 with the base shared
(1.24x), 337 MB with it private per rank; a worker 50.8 MB shared (a third of the base, 30.6 MB, its adapters and
about 20 MB of activations and optimizer state) against 111.6 MB private; the node's whole PSS 749 MB at -n 1 and
1,770 MB at -n 3 (2.36x: the runtime, 539-626 MB a process, is most of it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2 ** 20
# Python puts this script's folder first on the path, and bench/kernels.py would then stand in for the
# `kernels` package transformers looks for: the folder goes to the path's end (for bench/proc_memory.py).
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

from proc_memory import mpi_rank, smaps_kb  # noqa: E402 - after the path is set


def _smaps():
    """(PSS, USS) in MiB of this process, after malloc_trim (proc_memory.smaps_kb)."""
    now = smaps_kb(trim=True)
    return now["pss"] / 1024, now["uss"] / 1024


def child(config_path, stats, private):
    """One rank of `fedmpi run CONFIG`, its memory after every round written to STATS/rank-<rank>.json;
    `private`: every rank keeps its own base (the sharing switched off, for the comparison)."""
    import atexit
    import resource

    import fedmpi.round.engine as engine
    from fedmpi.cli import main
    from fedmpi.core import shared_base

    if private == "private":
        shared_base.share_base = lambda module, comm: None

    rank = mpi_rank()
    rounds = []
    run_round = engine.run_round

    def measured(parts, t, **kwargs):
        try:
            return run_round(parts, t, **kwargs)
        finally:
            rounds.append(_smaps())

    engine.run_round = measured
    import fedmpi.run.launch as launch

    made = launch.experiment
    at_setup, before = [], []
    import peft  # noqa: F401 - imported before the runtime's reading, which then holds the libraries
    import transformers  # noqa: F401

    def experiment(*a, **k):
        before.append(_smaps())         # the runtime alone: Python, torch, transformers, peft, MPI
        exp = made(*a, **k)
        at_setup.append(_smaps())
        return exp

    launch.experiment = experiment        # launch.set_up calls it by this name

    def write():
        pss, uss = zip(*rounds) if rounds else ((0,), (0,))
        Path(stats, f"rank-{rank}.json").write_text(json.dumps(
            {"rank": rank, "pss_mb": pss[-1], "uss_mb": uss[-1], "runtime_pss_mb": before[0][0],
             "setup_pss_mb": at_setup[0][0],
             "setup_uss_mb": at_setup[0][1],
             "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))

    atexit.register(write)
    sys.argv = ["fedmpi", "run", config_path, "--overwrite"]
    main()


def sizes(layers, width):
    """(base bytes, adapter bytes) of the model, built as the run builds it."""
    import torch

    from fedmpi.config import LoraConfig, ModelConfig
    from fedmpi.core.flat import FlatModel
    from fedmpi.core.models import build_model
    from fedmpi.core.shared_base import frozen_size

    torch.manual_seed(0)
    model = build_model(ModelConfig(name="causal_lm", arch=arch(layers, width)), (80,), 80, LoraConfig())
    return frozen_size(model)[1], 4 * FlatModel(model).dim


def arch(layers, width):
    return {"n_layer": layers, "n_embd": width, "n_head": 8, "n_positions": 80}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=576)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 3])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--private", action="store_true", help="also each -n > 1 with the base private to every rank")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(*args.child)
    sys.path.insert(0, str(ROOT / "tests"))
    import yaml
    from dataset_files import write_leaf

    from fedmpi.analysis.batch_report import find_mpiexec

    work = Path(tempfile.mkdtemp(prefix="lora-memory-"))
    write_leaf(work / "shakespeare", "shakespeare", users_train=(16, 16, 16), users_test=(4, 4, 4))
    base, adapters = sizes(args.layers, args.width)
    print(json.dumps({"base_mb": base / MIB, "adapters_mb": adapters / MIB}), flush=True)
    node, model = {}, {}
    runs = [(n, "shared") for n in args.ranks] + [(n, "private") for n in args.ranks if n > 1 and args.private]
    for n, how in runs:
        stats = work / f"stats-{n}-{how}"
        stats.mkdir()
        cfg = {"seed": 0, "rounds": args.rounds, "out": str(work / f"run-{n}"),
               "data": {"name": "shakespeare", "root": str(work / "shakespeare")},
               "partition": {"clients": 3, "scheme": "natural"},
               "model": {"name": "causal_lm", "arch": arch(args.layers, args.width)}, "lora": {"rank": 8},
               "client": {"lr": 0.05, "batch_size": 8, "steps": 1}, "server": {"clients_per_round": 3},
               "eval": {"batch_size": 12}, "runtime": {"threads": 1, "progress": "off"}}
        path = work / f"lm-{n}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, __file__, "--child", str(path), str(stats),
                        how], check=True, cwd=ROOT)
        ranks = sorted((json.loads(f.read_text()) for f in stats.glob("rank-*.json")), key=lambda r: r["rank"])
        node[n, how] = sum(r["pss_mb"] for r in ranks)
        # What the model costs: each rank's PSS after its rounds less its PSS before the data and the model
        # (the runtime every process carries whatever it holds)
        model[n, how] = sum(r["pss_mb"] - r["runtime_pss_mb"] for r in ranks)
        workers = [r["pss_mb"] - r["runtime_pss_mb"] for r in ranks if r["rank"] > 0]
        print(json.dumps({"n": n, "base": how, "node_pss_mb": node[n, how], "node_model_mb": model[n, how],
                          "worker_model_mb": max(workers, default=None),
                          "worker_bound_mb": (base / n + 3 * adapters) / MIB, "ranks": ranks}), flush=True)
    if (1, "shared") in node and (3, "shared") in node:
        print(json.dumps({"node_pss_n3_over_n1": node[3, "shared"] / node[1, "shared"],
                          "node_model_n3_over_n1": model[3, "shared"] / model[1, "shared"]}))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
