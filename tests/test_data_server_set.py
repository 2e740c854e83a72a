"""The server's set: size, scheme, overlap/holdout, seeding, statistics, and how report shows them."""

import numpy as np
import pytest

from fedmpi import config
from fedmpi.analysis.report import Run, format_table, mean_client_emd, server_summary, summarize
from fedmpi.core.errors import ConfigError
from fedmpi.data.dataset import Dataset
from fedmpi.data.server_set import draw_server_set as draw_with_sections
from fedmpi.data.server_set import split_dataset


def labelled(per_class=100, classes=10):
    y = np.random.default_rng(1).permutation(np.repeat(np.arange(classes), per_class)).astype(np.int64)
    x = np.zeros((len(y), 1), dtype=np.float32)
    return Dataset("test", x, y, x[:1], y[:1], classes)


def make_cfg(seed=0, partition=None, **server):
    return config.from_dict({"seed": seed, "partition": partition or {"clients": 10, "scheme": "iid"},
                             "server_data": server, "server": {"clients_per_round": 2}})


def split_of(cfg, ds):
    """The split of `cfg`'s sections (the data package takes sections, not the config)."""
    return split_dataset(ds, cfg.partition, cfg.server_data, cfg.seed, cfg.eval.local_every)


def draw_server_set(labels, cfg):
    return draw_with_sections(labels, cfg.server_data, cfg.seed)


def test_no_server_set_by_default():
    ds = labelled()
    split = split_of(make_cfg(), ds)
    assert split.server_idx.dtype == np.int64 and len(split.server_idx) == 0
    assert sum(len(p) for p in split.parts) == 1000
    server = split.groups["partition/server"]
    assert server["samples"].tolist() == [0] and np.isnan(server["emd"][0])
    assert server_summary(server, make_cfg().server_data).startswith("server set: none")


def test_iid_set_has_size_and_mixed_labels():
    ds = labelled()
    idx = draw_server_set(ds.y_train, make_cfg(size=200, scheme="iid"))
    assert len(idx) == 200 and len(np.unique(idx)) == 200 and np.all(np.diff(idx) > 0)
    assert (np.bincount(ds.y_train[idx], minlength=10) > 0).all()


def test_classes_set_covers_exactly_that_many_classes_evenly():
    ds = labelled()
    idx = draw_server_set(ds.y_train, make_cfg(size=90, scheme="classes", classes=3))
    counts = np.bincount(ds.y_train[idx], minlength=10)
    assert len(idx) == 90 and (counts > 0).sum() == 3 and sorted(counts[counts > 0]) == [30, 30, 30]


def test_dirichlet_set_skew_follows_beta():
    ds = labelled(200)

    def emd(beta):
        idx = draw_server_set(ds.y_train, make_cfg(size=300, scheme="dirichlet", beta=beta))
        assert len(idx) == 300 and len(np.unique(idx)) == 300
        p = np.bincount(ds.y_train[idx], minlength=10) / 300
        return np.abs(p - 0.1).sum()

    assert emd(100.0) < 0.25 < emd(0.05)


def test_dirichlet_set_larger_than_a_class_still_fills():
    ds = labelled(30)
    idx = draw_server_set(ds.y_train, make_cfg(size=250, scheme="dirichlet", beta=0.01))
    assert len(idx) == 250 and len(np.unique(idx)) == 250


def test_overlap_clients_partition_everything():
    ds = labelled()
    split = split_of(make_cfg(size=100, source="overlap"), ds)
    assert len(np.concatenate(split.parts)) == 1000
    assert np.isin(split.server_idx, np.concatenate(split.parts)).all()


def test_holdout_removes_the_set_from_the_clients_pool():
    ds = labelled()
    cfg = make_cfg(size=100, scheme="classes", classes=2, source="holdout",
                   partition={"clients": 10, "scheme": "dirichlet", "beta": 0.5})
    split = split_of(cfg, ds)
    joined = np.concatenate(split.parts)
    assert len(joined) == 900 and not np.isin(split.server_idx, joined).any()
    assert np.array_equal(np.sort(np.concatenate([joined, split.server_idx])), np.arange(1000))
    server = split.groups["partition/server"]
    assert server["samples"].tolist() == [100] and (server["labels"][0] > 0).sum() == 2
    assert server["emd"][0] == pytest.approx(1.6)      # two of ten classes: |0.5 - 0.1| * 2 + 0.1 * 8
    assert split.groups["partition"]["labels"].shape == (10, 10)
    assert "100 samples (classes, holdout), 2 classes, EMD 1.600" in server_summary(server, cfg.server_data)


def test_server_set_is_seeded_and_independent_of_the_partition_seed_stream():
    ds = labelled()
    a = draw_server_set(ds.y_train, make_cfg(seed=5, size=50))
    b = draw_server_set(ds.y_train, make_cfg(seed=5, size=50))
    c = draw_server_set(ds.y_train, make_cfg(seed=6, size=50))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # The same seed's client partition does not change when a server set is drawn with overlap.
    plain = split_of(make_cfg(seed=5), ds).parts
    with_set = split_of(make_cfg(seed=5, size=50), ds).parts
    assert all(np.array_equal(x, y) for x, y in zip(plain, with_set))


@pytest.mark.parametrize("server, message", [
    ({"size": 5000}, "server_data.size = 5000"),
    ({"size": 50, "scheme": "classes", "classes": 11}, "server_data.classes = 11"),
    ({"size": 500, "scheme": "classes", "classes": 2}, "class .* would need 250"),
])
def test_impossible_server_sets_are_config_errors(server, message):
    with pytest.raises(ConfigError, match=message):
        draw_server_set(labelled().y_train, make_cfg(**server))


def test_report_shows_sample_weighted_client_emd():
    partition = {"samples": np.array([10, 30]), "emd": np.array([1.0, 0.2]), "labels": np.ones((2, 3))}
    run = Run("x/run.h5", {"status": "finished", "algorithm": "fedavg"},
              {"round": np.arange(3.0), "test_acc": np.array([0.1, 0.2, 0.3])}, partition)
    assert mean_client_emd(partition) == pytest.approx((10 * 1.0 + 30 * 0.2) / 40)
    rows = summarize([run])
    assert rows[0]["emd"] == pytest.approx(0.4)
    assert "emd" in format_table(rows).splitlines()[0] and "0.400" in format_table(rows)
