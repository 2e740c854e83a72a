"""W4 of the benchmark: cross-device scale, run by bench/bench.py (`--workloads W4`).

Two workloads, each with FedAvg and SCAFFOLD, 100 clients a round, at -n 2 and -n 3:
  W4-lr   100,000 SYNTHETIC(1,1) users of 40 samples (4 M training samples, 1.24 GB), logistic regression
  W4-img  FEMNIST's shape: 3,400 clients of 200 28x28 images of 62 classes (680,000 training and 68,000
          test images, 2.35 GB as float32), IID; written by the bench as EMNIST-byclass idx files (class
          templates plus noise: the data is for speed and memory, not for accuracy); McMahan's 2NN (mlp)
and SCAFFOLD on W4-img once more with `runtime.client_state_memory: 256MB` at -n 3 (state spilled to disk).

Reported per row: seconds per round (median of rounds 2..), the first round, the whole process; the data
set's size; each rank's peak resident memory (RSS: every page it touched, its share of the node's shared
data set included), peak PSS and USS (sampled by bench/_rank.py); the largest PSS minus the data set's
share (data / P), the overhead of a rank; run.h5's growth per 100 rounds (bytes of one round's rows of
/metrics, /clients and /timing, times 100) and the file's size at the end.
"""

from __future__ import annotations

import math
import os
import statistics
import struct
from pathlib import Path

W4_RANKS = (2, 3)
ALGORITHMS = ("fedavg", "scaffold")
SPILL = {"runtime": {"client_state_memory": "256MB"}}
WORKLOADS = {
    "W4-lr": {"rounds": 100, "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0},
              "partition": {"clients": 100_000, "scheme": "natural", "samples_per_client": 40},
              "model": {"name": "lr"}, "server": {"clients_per_round": 100}},
    "W4-img": {"rounds": 20, "data": {"name": "emnist", "split": "byclass"},
               "partition": {"clients": 3400, "scheme": "iid"}, "model": {"name": "mlp", "hidden": 200},
               "server": {"clients_per_round": 100}},
}
IMG_CLIENTS, IMG_PER_CLIENT, IMG_TEST_PER_CLIENT, IMG_CLASSES, SIDE = 3400, 200, 20, 62, 28


# --- FEMNIST-shaped data --------------------------------------------------------------------------------

def _write_idx(path, array):
    """The idx format (magic 0 0 0x08 ndim, big-endian sizes, the bytes), written in chunks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape))
        for start in range(0, len(array), 50_000):
            fh.write(array[start:start + 50_000].tobytes())


def femnist_shape(root, clients=IMG_CLIENTS, seed=0):
    """EMNIST-byclass idx files of FEMNIST's shape under ROOT/EMNIST/raw (kept when already there): each
    class a smooth random template, each image its class's template plus noise, as uint8."""
    import numpy as np

    raw = Path(root) / "EMNIST" / "raw"
    names = {part: (raw / f"emnist-byclass-{part}-images-idx3-ubyte", raw / f"emnist-byclass-{part}-labels-idx1-ubyte")
             for part in ("train", "test")}
    counts = {"train": clients * IMG_PER_CLIENT, "test": clients * IMG_TEST_PER_CLIENT}
    if all(p.exists() and p.stat().st_size == 16 + counts[part] * SIDE * SIDE
           for part, (p, _) in names.items()):
        return str(root)
    g = np.random.default_rng(seed)
    templates = g.random((IMG_CLASSES, SIDE, SIDE))
    for _ in range(3):      # smooth: strokes rather than salt and pepper
        templates = (templates + np.roll(templates, 1, 1) + np.roll(templates, 1, 2)) / 3
    templates = (templates > np.median(templates)) * 200.0
    for part, (images_path, labels_path) in names.items():
        labels = g.integers(0, IMG_CLASSES, counts[part]).astype(np.uint8)
        images = np.empty((counts[part], SIDE, SIDE), dtype=np.uint8)
        for start in range(0, len(labels), 20_000):
            chunk = labels[start:start + 20_000]
            noisy = templates[chunk] + g.normal(0, 40, (len(chunk), SIDE, SIDE))
            images[start:start + len(chunk)] = np.clip(noisy, 0, 255).astype(np.uint8)
        _write_idx(images_path, images)
        _write_idx(labels_path, labels)
    return str(root)


# --- runs -----------------------------------------------------------------------------------------------

def plan(ranks=W4_RANKS):
    """[(workload, label, -n, extra config)] of the W4 table."""
    rows = [(wl, algo, n, {"algorithm": {"name": algo}}) for wl in WORKLOADS for algo in ALGORITHMS for n in ranks]
    spill_n = max(ranks)
    rows.append(("W4-img", "scaffold, state <= 256MB", spill_n, {"algorithm": {"name": "scaffold"}, **SPILL}))
    return rows


def data_bytes(cfg_map):
    """Bytes of the data set's arrays (training and test inputs and labels), from the source's specs."""
    import numpy as np

    from fedmpi import config
    from fedmpi.data import sources

    cfg = config.from_dict(cfg_map)
    specs = sources.STREAMED[cfg.data.name](cfg.data, cfg.seed, cfg.partition).specs()
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for name, (shape, dtype) in specs.items()
               if name in ("x_train", "y_train", "x_test", "y_test"))


def h5_growth(path):
    """(bytes one round adds to /metrics, /clients and /timing, the file's size)."""
    import h5py
    import numpy as np

    per_round = 0
    with h5py.File(path, "r", locking=False) as f:
        for group in ("metrics", "clients", "timing"):
            for ds in f.get(group, {}).values():
                per_round += ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
    return per_round, os.path.getsize(path)


def scaled(mapping, scale):
    """A workload with its client count (and clients per round) times `scale`, for smoke tests."""
    if scale == 1:
        return mapping
    clients = max(2, int(mapping["partition"]["clients"] * scale))
    per_round = min(mapping["server"]["clients_per_round"], clients)
    return {**mapping, "partition": {**mapping["partition"], "clients": clients},
            "server": {**mapping["server"], "clients_per_round": per_round}}


def run(bench, base, rounds=None, ranks=W4_RANKS, timeout=3600, scale=1.0):
    """Every W4 row (`bench`: bench.py's helpers); returns (table rows, records)."""
    img_clients = scaled(WORKLOADS["W4-img"], scale)["partition"]["clients"]
    img_root = femnist_shape(base / f"femnist-shape-{img_clients}", clients=img_clients)
    rows, records = [], {}
    for wl, label, n, extra in plan(ranks):
        work = base / wl / f"{label.split(',')[0]}{'-spill' if 'state' in label else ''}" / f"n{n}"
        mapping = bench._merge(bench._merge(bench._COMMON, scaled(WORKLOADS[wl], scale)), extra)
        if wl == "W4-img":
            mapping = bench._merge(mapping, {"data": {"root": img_root}})
        cfg = bench.workload_config_from(mapping, work / "out", rounds)
        sample = bench.run_fedmpi(cfg, n, work, timeout=timeout, sample_memory=True)
        per_round, size = h5_growth(Path(cfg["out"]) / "run.h5")
        sample.update(data_bytes=data_bytes(cfg), h5_round_bytes=per_round, h5_bytes=size, n=n)
        records[f"{wl} {label} -n {n}"] = sample
        rows.append(format_row(wl, label, sample))
        print(f"  {wl} {label} -n {n}: {_median_later(sample['rounds']):.4f} s/round, whole {sample['whole_s']:.1f} s, "
              f"peak RSS {max(sample['peak_rss_mb']):.0f} MB", flush=True)
    return rows, records


def _median_later(rounds):
    return statistics.median(rounds[1:]) if len(rounds) > 1 else rounds[0]


HEADER = ("workload", "algorithm", "run", "s/round", "1st s", "whole s", "data MB", "peak RSS MB/rank",
          "PSS MB/rank", "USS MB/rank", "PSS-data/P", "h5 MB/100r", "h5 MB")


def format_row(wl, label, s):
    """One W4 row. `PSS-data/P` is a rank's overhead beyond its share of the data set: the largest peak PSS
    (a page shared by k ranks counts 1/k, so the node's one copy of the data set is divided among its ranks)
    minus data / P. RSS would count every shared page a rank ever read in full: where clients move between
    workers each round, a worker reads most of the data set over a run."""
    mb = 1e6
    share = s["data_bytes"] / s["n"] / 2 ** 20     # memory figures are MiB (ru_maxrss), as the rest of the bench
    over = max(p - share for p in s["peak_pss_mb"])
    slash = lambda values: "/".join(f"{v:.0f}" for v in values)  # noqa: E731
    return (wl, label, f"-n {s['n']}", f"{_median_later(s['rounds']):.4f}", f"{s['rounds'][0]:.2f}",
            f"{s['whole_s']:.1f}", f"{s['data_bytes'] / mb:.0f}", slash(s["peak_rss_mb"]),
            slash(s["peak_pss_mb"]), slash(s["peak_uss_mb"]), f"{over:.0f}",
            f"{100 * s['h5_round_bytes'] / mb:.3f}", f"{s['h5_bytes'] / mb:.2f}")


def expected_overhead_note(rows):
    """Largest 'PSS - data/P' of the table (MB), the fixed overhead docs/results/performance.md states."""
    return max(math.ceil(float(r[10])) for r in rows) if rows else 0
