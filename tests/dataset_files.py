"""Writers of small data sets in the real on-disk formats, for the loader and model tests.

idx-ubyte files under the folder layout torchvision expects (ROOT/MNIST/raw/...), CIFAR's python pickled
batches (ROOT/cifar-10-batches-py/...) and LEAF JSON (ROOT/train/*.json, ROOT/test/*.json). Images carry a
class-dependent bright row so that models can learn something in a few steps.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import numpy as np

MNIST_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def write_idx(path, array):
    """The idx format: magic 0x00 0x00 0x08 (unsigned byte) ndim, big-endian sizes, then the bytes."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(bytes([0, 0, 0x08, array.ndim]))
        fh.write(struct.pack(f">{array.ndim}I", *array.shape))
        fh.write(array.tobytes())


def class_images(labels, shape, seed):
    """uint8 images (N x H x W or N x H x W x C): noise plus a bright row at a class-dependent height."""
    g = np.random.default_rng(seed)
    images = g.integers(0, 60, size=(len(labels), *shape), dtype=np.uint8)
    rows = (np.asarray(labels) * 3) % shape[0]
    images[np.arange(len(labels)), rows] = 250
    return images


def write_mnist_family(root, subdir="MNIST", n_train=120, n_test=40, classes=10, names=None, seed=0):
    """Writes ROOT/SUBDIR/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte; returns the arrays written."""
    names = names or MNIST_NAMES
    out = {}
    for part, n in (("train", n_train), ("test", n_test)):
        labels = np.arange(n) % classes
        images = class_images(labels, (28, 28), seed + (part == "test"))
        write_idx(Path(root) / subdir / "raw" / names[part][0], images)
        write_idx(Path(root) / subdir / "raw" / names[part][1], labels)
        out[part] = (images, labels)
    return out


def emnist_names(split):
    return {part: (f"emnist-{split}-{part}-images-idx3-ubyte", f"emnist-{split}-{part}-labels-idx1-ubyte")
            for part in ("train", "test")}


def write_cifar(root, kind="cifar10", n_train=100, n_test=30, seed=0):
    """Writes CIFAR-10's five data batches and test batch (or CIFAR-100's train/test) as python pickles in
    the official layout: dicts with 'data' (N x 3072 uint8, channel-major rows) and 'labels'/'fine_labels'."""
    classes = 10 if kind == "cifar10" else 100
    folder = Path(root) / ("cifar-10-batches-py" if kind == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)
    label_key = "labels" if kind == "cifar10" else "fine_labels"
    train_files = [f"data_batch_{i}" for i in range(1, 6)] if kind == "cifar10" else ["train"]
    test_files = ["test_batch"] if kind == "cifar10" else ["test"]
    out = {}
    for part, n, files in (("train", n_train, train_files), ("test", n_test, test_files)):
        labels = np.arange(n) % classes
        images = class_images(labels, (32, 32, 3), seed + (part == "test"))      # N x H x W x C
        rows = images.transpose(0, 3, 1, 2).reshape(n, 3072)
        for chunk, name in zip(np.array_split(np.arange(n), len(files)), files):
            entry = {"data": rows[chunk], label_key: labels[chunk].tolist()}
            with open(folder / name, "wb") as fh:
                pickle.dump(entry, fh, protocol=2)
        out[part] = (images, labels)
    return out


def write_leaf(root, kind, users_train=(6, 9, 4), users_test=(3, 2, 2), seed=0, files=2):
    """LEAF JSON: each user u_k with the given sample counts, users spread over `files` files per part.
    femnist: x = 784 floats in [0, 1], y = class id; shakespeare: x = 80-char strings, y = the next char."""
    g = np.random.default_rng(seed)
    written = {}
    for part, counts in (("train", users_train), ("test", users_test)):
        users = [f"u{k:03d}" for k in range(len(counts))]
        data = {}
        for user, n in zip(users, counts):
            if kind == "femnist":
                y = g.integers(0, 62, n)
                x = (class_images(y % 9, (28, 28), int(g.integers(1 << 30))).reshape(n, 784) / 255.0).tolist()
                data[user] = {"x": x, "y": y.tolist()}
            else:
                text = "".join(g.choice(list(VOCAB), size=80 + n))
                data[user] = {"x": [text[i:i + 80] for i in range(n)], "y": [text[i + 80] for i in range(n)]}
        for f, chunk in enumerate(np.array_split(np.arange(len(users)), files)):
            names = [users[i] for i in chunk]
            blob = {"users": names, "num_samples": [counts[i] for i in chunk],
                    "user_data": {u: data[u] for u in names}}
            path = Path(root) / part / f"all_data_{f}_niid_{part}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(blob))
        written[part] = (users, data)
    return written
