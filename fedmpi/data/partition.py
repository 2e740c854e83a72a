"""Partitions of a training set into clients (ALGORITHMS.md "Partitions"), seeded.

Each scheme maps (labels, config, generator) to a list of index arrays, one per client. New schemes
register in SCHEMES.
"""

from __future__ import annotations

import numpy as np

from fedmpi import rng
from fedmpi.errors import ConfigError

MAX_DIRICHLET_DRAWS = 1000


def iid(labels, cfg, g, pool):
    """Random equal split (sizes differ by at most one)."""
    return [np.sort(part) for part in np.array_split(g.permutation(pool), cfg.partition.clients)]


def dirichlet(labels, cfg, g, pool):
    """NIID-Bench "labeldir": per class, proportions ~ Dir(beta) over clients; clients already holding
    n/N samples get no more of the next class; redrawn until every client has `min_samples`."""
    p = cfg.partition
    n_clients, pool_labels = p.clients, labels[pool]
    classes = np.unique(pool_labels)
    cap = len(pool) / n_clients
    for _ in range(MAX_DIRICHLET_DRAWS):
        parts = [[] for _ in range(n_clients)]
        for c in classes:
            idx = g.permutation(pool[pool_labels == c])
            share = g.dirichlet(np.full(n_clients, p.beta))
            share = share * np.array([len(part) < cap for part in parts])
            share = share / share.sum()
            cuts = (np.cumsum(share) * len(idx)).astype(int)[:-1]
            for part, piece in zip(parts, np.split(idx, cuts)):
                part.extend(piece.tolist())
        if min(len(part) for part in parts) >= p.min_samples:
            return [np.sort(np.array(part, dtype=np.int64)) for part in parts]
    raise ConfigError(f"partition.beta = {p.beta}: {MAX_DIRICHLET_DRAWS} Dirichlet draws all left a client with "
                      f"fewer than partition.min_samples = {p.min_samples} samples; raise beta, lower "
                      f"min_samples or use fewer clients ({n_clients} share {len(pool)} samples)")


def natural(labels, cfg, g, pool, users=None):
    """The source's own users as clients (SYNTHETIC users, LEAF writers)."""
    if users is None:
        raise ConfigError(f"partition.scheme = 'natural': data.name = {cfg.data.name!r} has no natural users; "
                          f"use synthetic, femnist or shakespeare, or another scheme")
    if len(users) != cfg.partition.clients:
        raise ConfigError(f"partition.clients = {cfg.partition.clients}: data.name = {cfg.data.name!r} has "
                          f"{len(users)} natural users")
    keep = set(pool.tolist()) if len(pool) != len(labels) else None
    return [np.asarray(u, dtype=np.int64) if keep is None else np.array([i for i in u if i in keep], dtype=np.int64)
            for u in users]


SCHEMES = {"iid": iid, "dirichlet": dirichlet, "natural": natural}


def partition(dataset, cfg, pool=None):
    """Splits `pool` (default: the whole training set) into `partition.clients` index arrays."""
    scheme = cfg.partition.scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"partition.scheme = {scheme!r}: not available in this version; "
                          f"available: {', '.join(SCHEMES)}")
    if pool is None:
        pool = np.arange(len(dataset.y_train))
    g = rng.stream(cfg.seed, rng.PARTITION)
    if scheme == "natural":
        parts = natural(dataset.y_train, cfg, g, pool, dataset.users)
    else:
        if len(pool) < cfg.partition.clients:
            raise ConfigError(f"partition.clients = {cfg.partition.clients}: only {len(pool)} training samples")
        parts = SCHEMES[scheme](dataset.y_train, cfg, g, pool)
    empty = [i for i, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ConfigError(f"partition.scheme = {scheme!r} left {len(empty)} client(s) without samples "
                          f"(first: client {empty[0]}); use fewer clients or another scheme")
    return parts
