"""Each partition scheme's defining property (docs/explanation/algorithms.md "Partitions"), on synthetic label
arrays."""

import numpy as np
import pytest

from fedmpi import config
from fedmpi.core.errors import ConfigError
from fedmpi.data.dataset import Dataset
from fedmpi.data.partition import partition
from fedmpi.data.stats import partition_stats, weighted_mean_emd


def labelled(per_class, classes=10, seed=0):
    """A Dataset with `per_class` samples of each class (shuffled), inputs irrelevant."""
    y = np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class)).astype(np.int64)
    x = np.zeros((len(y), 1), dtype=np.float32)
    return Dataset("test", x, y, x[:1], y[:1], classes)


def split(ds, seed=0, **partition_keys):
    cfg = config.from_dict({"seed": seed, "partition": partition_keys, "server": {"clients_per_round": 1}})
    return partition(ds, cfg.partition, cfg.seed)


def assert_disjoint(parts, n_total=None):
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "a sample went to two clients"
    if n_total is not None:
        assert len(joined) == n_total, "samples lost or invented"


def test_iid_near_equal_sizes_and_label_mix():
    ds = labelled(200)
    parts = split(ds, clients=7, scheme="iid")
    assert_disjoint(parts, 2000)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    stats = partition_stats(ds.y_train, parts, 10)
    assert (stats["labels"] > 0).all() and stats["emd"].max() < 0.2


def test_dirichlet_every_client_has_min_samples():
    ds = labelled(100)
    for beta in (0.1, 0.5):
        parts = split(ds, clients=20, scheme="dirichlet", beta=beta, min_samples=15)
        assert_disjoint(parts, 1000)
        assert min(len(p) for p in parts) >= 15


def test_dirichlet_emd_grows_as_beta_shrinks():
    ds = labelled(300)
    emds = []
    for beta in (100.0, 1.0, 0.1):
        parts = split(ds, clients=10, scheme="dirichlet", beta=beta, min_samples=5)
        hist = partition_stats(ds.y_train, parts, 10)["labels"]
        emds.append(weighted_mean_emd(hist, np.bincount(ds.y_train)))
    assert emds[0] < 0.25 and emds[0] < emds[1] < emds[2] and emds[2] > 0.8


def test_dirichlet_impossible_minimum_is_a_config_error():
    with pytest.raises(ConfigError, match="partition.min_samples = 500"):
        split(labelled(20), clients=5, scheme="dirichlet", beta=0.5, min_samples=500)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_labels_exactly_k_labels_per_client(k):
    ds = labelled(120)
    parts = split(ds, clients=12, scheme="labels", labels_per_client=k)
    assert_disjoint(parts)
    hist = partition_stats(ds.y_train, parts, 10)["labels"]
    assert ((hist > 0).sum(axis=1) == k).all()
    for i in range(12):                     # client i always holds class i mod K
        assert hist[i, i % 10] > 0
    # Each class is split evenly among its holders: sizes of one class differ by at most one.
    for c in range(10):
        held = hist[:, c][hist[:, c] > 0]
        if len(held):
            assert held.max() - held.min() <= 1 and held.sum() == 120


def test_shards_one_shard_per_client_gives_one_class():
    ds = labelled(50)
    parts = split(ds, clients=10, scheme="shards", shards_per_client=1)
    assert_disjoint(parts, 500)
    hist = partition_stats(ds.y_train, parts, 10)["labels"]
    assert ((hist > 0).sum(axis=1) == 1).all() and sorted(hist.argmax(axis=1)) == list(range(10))


def test_shards_two_per_client_at_most_two_classes():
    ds = labelled(60)
    parts = split(ds, clients=15, scheme="shards", shards_per_client=2)
    assert_disjoint(parts, 600)
    assert all(len(p) == 40 for p in parts)
    hist = partition_stats(ds.y_train, parts, 10)["labels"]
    assert ((hist > 0).sum(axis=1) <= 2).all()


@pytest.mark.parametrize("c_per, samples", [(2, 60), (3, None), (10, None)])
def test_classes_exactly_c_classes_with_equal_shares(c_per, samples):
    ds = labelled(100)
    keys = {"samples_per_client": samples} if samples else {}
    parts = split(ds, clients=8, scheme="classes", classes_per_client=c_per, **keys)
    assert_disjoint(parts)
    hist = partition_stats(ds.y_train, parts, 10)["labels"]
    per_class = (samples or 1000 // 8) // c_per if samples else None
    for row in hist:
        held = row[row > 0]
        assert len(held) == c_per and (held == held[0]).all()
        if per_class is not None:
            assert held[0] == per_class
    if samples is None:   # default n_i: the largest equal share the classes can supply, <= n / N
        assert hist.sum(axis=1).max() <= 1000 // 8


def test_classes_not_enough_samples_is_a_config_error():
    with pytest.raises(ConfigError, match="partition.samples_per_client = 400"):
        split(labelled(100), clients=10, scheme="classes", classes_per_client=2, samples_per_client=400)
    with pytest.raises(ConfigError, match="classes_per_client = 11"):
        split(labelled(100), clients=10, scheme="classes", classes_per_client=11)


def test_quantity_sizes_skewed_labels_mixed():
    ds = labelled(300)
    parts = split(ds, clients=10, scheme="quantity", beta=0.5, min_samples=10)
    assert_disjoint(parts, 3000)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 10 and sizes.max() > 2 * sizes.min()
    stats = partition_stats(ds.y_train, parts, 10)
    big = np.argmax(sizes)
    assert stats["emd"][big] < 0.3 and (stats["labels"][big] > 0).all()


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "labels", "shards", "classes", "quantity"])
def test_same_seed_same_split_other_seed_other_split(scheme):
    ds = labelled(60)
    keys = {"min_samples": 5} if scheme in ("dirichlet", "quantity") else {}    # the schemes that read it
    a = split(ds, seed=3, clients=6, scheme=scheme, **keys)
    b = split(ds, seed=3, clients=6, scheme=scheme, **keys)
    c = split(ds, seed=4, clients=6, scheme=scheme, **keys)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_partition_of_a_pool_uses_only_the_pool():
    ds = labelled(50)
    cfg = config.from_dict({"partition": {"clients": 4, "scheme": "labels"}, "server": {"clients_per_round": 1}})
    pool = np.arange(100, 500)
    parts = partition(ds, cfg.partition, cfg.seed, pool)
    assert np.isin(np.concatenate(parts), pool).all()
    assert_disjoint(parts)
