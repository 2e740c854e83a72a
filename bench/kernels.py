"""A client's local step with fedmpi's CPU kernels (`runtime.kernels`, fedmpi/core/cpu_kernels.py) against the
plain PyTorch loop's, in one process with one thread: ms per step and the ratios.

    python bench/kernels.py                  # cnn_mnist (W1, QS) and pfl_cnn (W5), 21 interleaved repeats
    python bench/kernels.py --repeats 41 --models cnn_mnist

Three ways take the same client (8 steps of batch 10, plain SGD, lr 0.05) from the same weights, in turn,
repeat after repeat (this host's speed drifts within minutes): `ref` (nn.Module and torch.optim.SGD, as
bench/reference_loop.py), `plain` (fedmpi's LocalTrainer with `kernels: plain`) and `fast` (`kernels:
auto`). Each figure is the median over repeats (min beside it); a ratio is the median's."""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {"cnn_mnist": (1, 28, 28), "pfl_cnn": (3, 32, 32), "cnn2": (3, 32, 32)}


def measure(name, repeats, steps=8, batch=10):
    import numpy as np
    import torch
    import torch.nn.functional as F

    from fedmpi import config
    from fedmpi.core.cpu_kernels import use_fast_kernels
    from fedmpi.core.flat import FlatModel
    from fedmpi.core.models import build_model
    from fedmpi.core.train import LocalTrainer, schedule

    torch.set_num_threads(1)
    shape = SHAPES[name]
    cfg = config.from_dict({"data": {"name": "synthetic"}, "model": {"name": name}, "out": "unused",
                            "client": {"lr": 0.05, "batch_size": batch, "epochs": 1}})
    torch.manual_seed(0)
    model = build_model(cfg.model, shape, 10)
    flats = {"plain": FlatModel(copy.deepcopy(model)), "fast": use_fast_kernels(FlatModel(copy.deepcopy(model)))}
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=cfg.client.lr)
    n = steps * batch
    x, y = torch.rand(n, *shape), torch.randint(0, 10, (n,))
    trainers = {k: LocalTrainer(f, cfg.client, x, y) for k, f in flats.items()}
    sched = schedule(cfg.client, n)

    def client(way):
        began = time.perf_counter()
        if way == "ref":
            ref.train()
            for s in range(steps):
                opt.zero_grad()
                F.cross_entropy(ref(x[s * batch:(s + 1) * batch]), y[s * batch:(s + 1) * batch]).backward()
                opt.step()
        else:
            trainers[way].train(torch.arange(n), np.random.default_rng(0), sched)
        return (time.perf_counter() - began) / steps * 1e3

    ways = ("ref", "plain", "fast")
    for way in ways:        # warm-up: first calls allocate and pick kernels
        client(way)
    times = {way: [] for way in ways}
    for _ in range(repeats):
        for way in ways:
            times[way].append(client(way))
    return {way: (statistics.median(v), min(v)) for way, v in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["cnn_mnist", "pfl_cnn"], choices=sorted(SHAPES))
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args(argv)
    print(f"{'model':10s} {'ref ms':>14s} {'plain ms':>14s} {'fast ms':>14s} {'fast/ref':>9s} {'plain/ref':>10s}")
    for name in args.models:
        got = measure(name, args.repeats)
        cells = " ".join(f"{got[w][0]:6.2f} ({got[w][1]:5.2f})" for w in ("ref", "plain", "fast"))
        print(f"{name:10s} {cells} {got['fast'][0] / got['ref'][0]:9.3f} {got['plain'][0] / got['ref'][0]:10.3f}")
    print("ms per step: median over repeats (min); ratios of the medians")


if __name__ == "__main__":
    main()
