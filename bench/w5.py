"""W5 of the benchmark: pfl-research's own CIFAR-10 benchmark setup, run by bench/bench.py.

pfl's benchmarks/image_classification/configs/baseline.yaml with `dataset: cifar10_iid`: 1,000 users of 50
images each (`mean_datapoints_per_user: 50`, constant), cohort 50, one local epoch, local batch 10, local lr
0.1, FedAvg with every user weighing 1 (`weight_by_samples: false`, here `server.weighting: uniform`),
server lr 1.0, and pfl's model `simple_cnn` (here `model.name: pfl_cnn`: 1,626,442 parameters, dropout
0.25 and 0.5, Glorot-uniform). The data is CIFAR-10's shape (50,000 training and 2,000 test images of
3x32x32, 10 classes), written by the bench in torchvision's CIFAR-10 python layout (cifar-10-batches-py:
data_batch_1..5, test_batch) and read by `data.name: cifar10`: class templates plus noise, for speed, not
for accuracy.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

# CIFAR-10's 50,000 training images; 2,000 test images rather than its 10,000 keep the final evaluation short
TRAIN, TEST, CLASSES, PIXELS = 50_000, 2_000, 10, 3 * 32 * 32

WORKLOAD = {
    "rounds": 5,
    "data": {"name": "cifar10"},            # data.root: set by bench.py to the folder written here
    "partition": {"clients": 1000, "scheme": "iid"},
    "model": {"name": "pfl_cnn"},
    "client": {"lr": 0.1, "batch_size": 10, "epochs": 1},
    "server": {"clients_per_round": 50, "lr": 1.0, "weighting": "uniform"},
}


def write_cifar10_like(root, train=TRAIN, test=TEST, seed=0):
    """Writes CIFAR-10-shaped batches under `root`/cifar-10-batches-py (dicts of 'data', N x 3072 uint8 in
    channel-major rows, and 'labels', pickled as torchvision's files are); returns `root`. Images are a
    class's template at half intensity plus uniform noise, so that the model has something to learn. Kept
    where a folder already holds batches of the requested sizes."""
    folder = Path(root) / "cifar-10-batches-py"
    stamp = folder / "fedmpi-bench.txt"
    wanted = f"{train} {test} {seed}"
    if stamp.exists() and stamp.read_text() == wanted:
        return Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(seed)
    templates = (g.integers(0, 256, (CLASSES, PIXELS)) // 2).astype(np.uint8)
    for name, count in [*((f"data_batch_{i}", train // 5 + (i <= train % 5)) for i in range(1, 6)),
                        ("test_batch", test)]:
        labels = g.integers(0, CLASSES, count)
        rows = templates[labels] + g.integers(0, 128, (count, PIXELS), dtype=np.uint8)
        with open(folder / name, "wb") as fh:
            pickle.dump({"data": rows, "labels": labels.tolist()}, fh, protocol=2)
    stamp.write_text(wanted)
    return Path(root)
