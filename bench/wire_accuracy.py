"""The accuracy cost of reduced-precision transport (runtime.wire_dtype, docs/results/performance.md): the quickstart
(jobs/configs/quickstart.yaml) and W1 (bench/bench.py) at float32, bfloat16 and float16, one process each
(-n 1: the results are the same at any -n), evaluated every round, one torch thread.

    python bench/wire_accuracy.py [--rounds R] [--out DIR]   # DIR default ./runs/wire_accuracy

Prints, per workload and dtype, the test accuracy of every round, the final test loss, bytes_up and
bytes_down of a round, and the largest accuracy difference to float32 over the rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DTYPES = ("float32", "bfloat16", "float16")


def _bench():
    spec = importlib.util.spec_from_file_location("fedmpi_bench", HERE / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def configs(out, rounds):
    """{workload: config mapping} for the quickstart and W1, evaluated every round, `rounds` rounds."""
    import yaml

    qs = yaml.safe_load((HERE.parent / "jobs" / "configs" / "quickstart.yaml").read_text())
    w1 = _bench().workload_config("W1", out / "W1")
    out_cfgs = {"quickstart": qs, "W1": w1}
    for cfg in out_cfgs.values():
        cfg["rounds"] = rounds or cfg["rounds"]
        cfg["eval"] = {**cfg.get("eval", {}), "every": 1}
        cfg["checkpoint"] = {"every": 0}
        cfg["runtime"] = {**cfg.get("runtime", {}), "progress": "off", "threads": 1}
    return out_cfgs


def run(out, rounds):
    import h5py
    import numpy as np
    import yaml

    from fedmpi.cli import main

    rows = {}
    for name, cfg in configs(out, rounds).items():
        for dtype in DTYPES:
            folder = out / name / dtype
            path = out / f"{name}-{dtype}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump({**cfg, "out": str(folder),
                                            "runtime": {**cfg["runtime"], "wire_dtype": dtype}}))
            code = main(["run", str(path), "--overwrite"])
            if code:
                sys.exit(f"wire_accuracy: {name} at {dtype} exited {code}")
            with h5py.File(folder / "run.h5", "r", locking=False) as f:
                rows[name, dtype] = {k: f["metrics"][k][()] for k in ("test_acc", "test_loss", "bytes_up",
                                                                       "bytes_down")}
    for name in configs(out, rounds):
        ref = rows[name, "float32"]["test_acc"]
        for dtype in DTYPES:
            r = rows[name, dtype]
            acc = " ".join(f"{a:.4f}" for a in r["test_acc"])
            print(f"{name:10s} {dtype:8s} final acc {r['test_acc'][-1]:.4f} loss {r['test_loss'][-1]:.4f} "
                  f"bytes_up {r['bytes_up'][-1]:.0f} bytes_down {r['bytes_down'][-1]:.0f} "
                  f"max |acc - float32| {np.max(np.abs(r['test_acc'] - ref)):.4f}   [{acc}]", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=None, help="rounds of each run (default: the workload's)")
    p.add_argument("--out", help="folder of the runs (default ./runs/wire_accuracy, refused inside the checkout)")
    args = p.parse_args(argv)
    from fedmpi.core.tool_outputs import output_or_default

    out = output_or_default(args.out, "bench/wire_accuracy.py", "runs/wire_accuracy", "--out", str(HERE.parent))
    run(Path(out), args.rounds)


if __name__ == "__main__":
    main()
