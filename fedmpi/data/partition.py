"""Partitions of a training set into clients (docs/explanation/algorithms.md "Partitions"), seeded.

Each scheme maps (labels, the partition section, generator, pool) to a list of index arrays, one per
client. New schemes register in SCHEMES.
"""

from __future__ import annotations

import numpy as np

from fedmpi.core import rng
from fedmpi.core.errors import ConfigError

MAX_DIRICHLET_DRAWS = 1000


def iid(labels, p, g, pool):
    """Random equal split (sizes differ by at most one)."""
    return [np.sort(part) for part in np.array_split(g.permutation(pool), p.clients)]


def dirichlet(labels, p, g, pool):
    """NIID-Bench "labeldir": per class, proportions ~ Dir(beta) over clients; clients already holding
    n/N samples get no more of the next class; redrawn until every client has `min_samples`."""
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


def natural(labels, p, g, pool, users=None, source=None):
    """The source's own users as clients (SYNTHETIC users, LEAF writers); `source`: the data set's name."""
    if users is None:
        raise ConfigError(f"partition.scheme = 'natural': data.name = {source!r} has no natural users; "
                          f"use synthetic, femnist, shakespeare or your own data with client ids (client_train; "
                          f"docs/how-to/own-data.md), or another scheme")
    if len(users) != p.clients:
        raise ConfigError(f"partition.clients = {p.clients}: data.name = {source!r} has "
                          f"{len(users)} natural users")
    in_pool = np.zeros(len(labels), dtype=bool)
    in_pool[pool] = True     # a held-out server set leaves each user only its remaining samples
    return [np.asarray(u, dtype=np.int64)[in_pool[np.asarray(u, dtype=np.int64)]] for u in users]


def label_subsets(labels, p, g, pool):
    """NIID-Bench "#C=k": client i holds class i mod K plus k-1 other random classes; each class is split
    evenly among the clients that hold it (K = the classes present in the pool)."""
    k, n_clients, pool_labels = p.labels_per_client, p.clients, labels[pool]
    classes = np.unique(pool_labels)
    if k > len(classes):
        raise ConfigError(f"partition.labels_per_client = {k}: the training pool has only {len(classes)} classes")
    holders = [[] for _ in classes]
    for i in range(n_clients):
        own = i % len(classes)
        others = g.choice(np.delete(np.arange(len(classes)), own), size=k - 1, replace=False)
        for c in (own, *others.tolist()):
            holders[c].append(i)
    parts = [[] for _ in range(n_clients)]
    for c, clients in enumerate(holders):
        if not clients:
            continue
        idx = g.permutation(pool[pool_labels == classes[c]])
        for i, piece in zip(clients, np.array_split(idx, len(clients))):
            parts[i].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


def shards(labels, p, g, pool):
    """McMahan et al. / Zhao et al.: sort by label, cut into clients * shards_per_client equal shards, deal
    each client shards_per_client random ones (1 shard per client = "1-class non-IID")."""
    per, n_clients = p.shards_per_client, p.clients
    n_shards = n_clients * per
    if n_shards > len(pool):
        raise ConfigError(f"partition.shards_per_client = {per}: {n_clients} clients x {per} shards exceed the "
                          f"{len(pool)} training samples")
    shuffled = g.permutation(pool)   # random order inside each class, then a stable sort by label
    ordered = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(ordered, n_shards)
    deal = g.permutation(n_shards).reshape(n_clients, per)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]


def classes(labels, p, g, pool):
    """FSL: each client gets C = classes_per_client classes and n_i / C samples of each, drawn without
    replacement. Classes are dealt round-robin over a random class order, so every class is held by
    floor or ceil(N C / K) clients. n_i is samples_per_client, or else the largest size <= pool / N that
    the classes can supply."""
    pool_labels = labels[pool]
    present, counts = np.unique(pool_labels, return_counts=True)
    c_per, n_clients = p.classes_per_client, p.clients
    if c_per > len(present):
        raise ConfigError(f"partition.classes_per_client = {c_per}: the training pool has only "
                          f"{len(present)} classes")
    order = g.permutation(len(present))
    held = [order[(np.arange(c_per) + i * c_per) % len(present)] for i in g.permutation(n_clients)]
    demand = np.bincount(np.concatenate(held), minlength=len(present))
    per_class = _samples_per_class(p, len(pool), present, counts, demand)
    shuffled = [g.permutation(pool[pool_labels == c]) for c in present]
    taken = np.zeros(len(present), dtype=np.int64)
    parts = []
    for row in held:
        pieces = [shuffled[c][taken[c]: taken[c] + per_class] for c in row]
        taken[row] += per_class
        parts.append(np.sort(np.concatenate(pieces)))
    return parts


def _samples_per_class(p, pool_size, present, counts, demand):
    if p.samples_per_client is not None:
        per_class = p.samples_per_client // p.classes_per_client
        short = np.flatnonzero(demand * per_class > counts)
        if per_class == 0 or len(short):
            c = short[0] if len(short) else 0
            raise ConfigError(f"partition.samples_per_client = {p.samples_per_client}: with classes_per_client = "
                              f"{p.classes_per_client}, {demand[c]} clients need {per_class} samples each of "
                              f"class {present[c]}, which has {counts[c]}; lower samples_per_client")
        return per_class
    fits = counts[demand > 0] // demand[demand > 0]
    per_class = int(min(pool_size // p.clients // p.classes_per_client, fits.min()))
    if per_class == 0:
        raise ConfigError(f"partition.classes_per_client = {p.classes_per_client}: {p.clients} clients leave no "
                          f"samples per class; use fewer clients or classes")
    return per_class


def quantity(labels, p, g, pool):
    """NIID-Bench quantity skew: sizes ~ Dir(beta) over clients, samples drawn at random (labels mixed);
    redrawn until every client has min_samples."""
    shuffled = g.permutation(pool)
    for _ in range(MAX_DIRICHLET_DRAWS):
        share = g.dirichlet(np.full(p.clients, p.beta))
        cuts = (np.cumsum(share) * len(pool)).astype(int)[:-1]
        if np.diff(cuts, prepend=0, append=len(pool)).min() >= max(p.min_samples, 1):
            return [np.sort(part) for part in np.split(shuffled, cuts)]
    raise ConfigError(f"partition.beta = {p.beta}: {MAX_DIRICHLET_DRAWS} Dirichlet draws all left a client with "
                      f"fewer than partition.min_samples = {p.min_samples} samples; raise beta or lower min_samples")


def groups(labels, p, g, pool):
    """Client groups with fixed label sets (`partition.groups`, the SAFL paper's clients holding digits
    {1,2,5,7,9} beside clients holding only {2}): client ids are dealt to the groups in order. With
    `samples_per_client` n every client gets n samples, as evenly as possible over its group's labels
    (the first labels take the remainder), drawn without replacement; without it each label's samples are
    split evenly at random among every client whose group holds it. Labels no group holds are left out."""
    pool_labels = labels[pool]
    present = set(np.unique(pool_labels).tolist())
    n = p.samples_per_client
    wants, cid = {}, 0           # label -> [(client, samples wanted or None)]
    for k, group_labels in p.groups:
        missing = [x for x in group_labels if x not in present]
        if missing:
            raise ConfigError(f"partition.groups: label {missing[0]} is not in the training pool (labels present: "
                              f"{', '.join(map(str, sorted(present)))})")
        shares = [len(a) for a in np.array_split(np.arange(n), len(group_labels))] if n else [None] * len(group_labels)
        for label, share in zip(group_labels, shares):
            wants.setdefault(label, []).extend((c, share) for c in range(cid, cid + k))
        cid += k
    parts = [[] for _ in range(p.clients)]
    for label in sorted(wants):
        idx = g.permutation(pool[pool_labels == label])
        if n is None:
            pieces = np.array_split(idx, len(wants[label]))
        else:
            need = sum(share for _, share in wants[label])
            if need > len(idx):
                raise ConfigError(f"partition.samples_per_client = {n}: the groups need {need} samples of label "
                                  f"{label}, the training pool has {len(idx)}; lower samples_per_client")
            pieces = np.split(idx[:need], np.cumsum([share for _, share in wants[label]])[:-1])
        for (client, _), piece in zip(wants[label], pieces):
            parts[client].append(piece)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


SCHEMES = {"iid": iid, "dirichlet": dirichlet, "labels": label_subsets, "shards": shards, "classes": classes,
           "quantity": quantity, "natural": natural, "groups": groups}
# The partition keys each scheme reads (`clients`: all of them). PartitionConfig refuses a key only other
# schemes read, set to a value other than its default: it would change nothing, without a word. Not
# `samples_per_client`: the synthetic data set reads it whatever the scheme (its users' sizes).
USES = {"iid": (), "dirichlet": ("beta", "min_samples"), "labels": ("labels_per_client",),
        "shards": ("shards_per_client",), "classes": ("classes_per_client",), "quantity": ("beta", "min_samples"),
        "natural": (), "groups": ("groups",)}


def partition(dataset, p, seed, pool=None):
    """Splits `pool` (default: the whole training set) into `p.clients` index arrays (`p`: the partition
    section; the draws come from the stream (seed, PARTITION))."""
    scheme = p.scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"partition.scheme = {scheme!r}: not available in this version; "
                          f"available: {', '.join(SCHEMES)}")
    if pool is None:
        pool = np.arange(len(dataset.y_train))
    g = rng.stream(seed, rng.PARTITION)
    if scheme == "natural":
        parts = natural(dataset.y_train, p, g, pool, dataset.users, dataset.name)
    else:
        if len(pool) < p.clients:
            raise ConfigError(f"partition.clients = {p.clients}: only {len(pool)} training samples")
        parts = SCHEMES[scheme](dataset.y_train, p, g, pool)
    empty = [i for i, part in enumerate(parts) if len(part) == 0]
    if empty:
        raise ConfigError(f"partition.scheme = {scheme!r} left {len(empty)} client(s) without samples "
                          f"(first: client {empty[0]}); use fewer clients or another scheme")
    return parts
