"""The data rules that select the papers' reference-code behaviour (issue 13), checked in-process against
hand-computed cases: data sharing's `warmup_target_acc`, Zhao et al.'s split (`server_data.fraction`,
`server_data.holdout`) and the `groups` partition. Split from tests/test_fidelity.py by topic (that file has
the training rules on a tiny regression; tests/test_fidelity_algorithms.py has MOON's and SAFL's)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import VecModel

import fedmpi
from fedmpi import config
from fedmpi.core.errors import ConfigError
from fedmpi.data.partition import partition
from fedmpi.data.server_set import resolved_size
from fedmpi.data.server_set import split_dataset as split_with_sections

# --- data sharing: warm-up to a target accuracy -------------------------------------------------------------

SHARE = {"seed": 1, "rounds": 2, "data": {"name": "mnist5k"}, "partition": {"clients": 10, "scheme": "shards",
         "shards_per_client": 1}, "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 20, "epochs": 1},
         "server": {"clients_per_round": 5},
         "server_data": {"size": 200, "scheme": "classes", "source": "holdout"},
         "algorithm": {"name": "datashare", "alpha": 0.5, "warmup_lr": 0.01},
         "runtime": {"threads": 1, "progress": "off"}}


def test_warmup_stops_at_the_first_epoch_reaching_the_target():
    target = 0.7
    run = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": 40, "algorithm.warmup_target_acc": target})
    epochs, acc = int(run.metrics["warmup_epochs"][0]), run.metrics["warmup_acc"][0]
    assert 1 < epochs < 40 and acc >= target
    assert np.isnan(run.metrics["warmup_epochs"][1])          # logged once, at round 0
    # The epoch before fell short: capped at epochs - 1 the warm-up ends below the target.
    short = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": epochs - 1, "algorithm.warmup_target_acc": target})
    assert short.metrics["warmup_epochs"][0] == epochs - 1 and short.metrics["warmup_acc"][0] < target
    # The same x_0 as a fixed warm-up of that many epochs: the runs agree.
    fixed = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": epochs})
    np.testing.assert_array_equal(fixed.model, run.model)
    # An unreachable target runs every epoch: identical to the fixed warm-up.
    capped = fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": 3, "algorithm.warmup_target_acc": 1.0})
    np.testing.assert_array_equal(capped.model, fedmpi.simulate(SHARE, **{"algorithm.warmup_epochs": 3}).model)
    assert capped.metrics["warmup_epochs"][0] == 3


def test_warmup_target_keys_are_validated():
    with pytest.raises(ConfigError, match="warmup_target_acc.*warmup_epochs > 0"):
        config.from_dict({"algorithm": {"name": "datashare", "warmup_target_acc": 0.6}})
    with pytest.raises(ConfigError, match="warmup_target_acc"):
        config.from_dict({"algorithm": {"name": "datashare", "warmup_epochs": 5, "warmup_target_acc": 1.5}})


# --- Zhao et al.'s split: holdout H, G sized relative to the clients' data ----------------------------------

class Labels:
    """A data set of labels only (the split reads nothing else): 100 samples of each of 10 classes."""

    def __init__(self):
        self.y_train = np.repeat(np.arange(10), 100)
        self.num_classes = 10
        self.users = None


def zhao_cfg(fraction, holdout=400, scheme="classes", **more):
    return config.from_dict({"seed": 2, "partition": {"clients": 10, "scheme": "shards", "shards_per_client": 1},
                             "server_data": {"fraction": fraction, "holdout": holdout, "scheme": scheme,
                                             "source": "holdout", **more}})


def split_dataset(cfg, ds):
    """The split of `cfg`'s sections (the data package takes sections, not the config)."""
    return split_with_sections(ds, cfg.partition, cfg.server_data, cfg.seed, cfg.eval.local_every)


def test_resolved_size_by_hand():
    sd = config.ServerDataConfig
    assert resolved_size(sd(fraction=0.1, holdout=1000, source="holdout"), 4000) == 300      # 0.1 * 3000
    assert resolved_size(sd(fraction=0.25, source="holdout"), 4000) == 800       # 800 / (4000 - 800) = 0.25
    assert resolved_size(sd(fraction=0.1), 4000) == 400                          # overlap: D is everything
    assert resolved_size(sd(size=123), 4000) == 123


def test_a_beta_sweep_keeps_the_clients_data_fixed():
    ds = Labels()
    splits = {f: split_dataset(zhao_cfg(f), ds) for f in (0.05, 0.1, 0.2)}
    holdout = np.setdiff1d(np.arange(1000), np.concatenate(splits[0.05].parts))
    assert len(holdout) == 400 and np.all(np.bincount(ds.y_train[holdout]) == 40)     # even over the classes
    first = splits[0.05].parts
    for f, split in splits.items():
        assert len(split.server_idx) == round(f * 600)           # |D| = 1000 - 400
        assert np.isin(split.server_idx, holdout).all()         # G is drawn from H
        clients = np.concatenate(split.parts)
        assert len(clients) == 600 and not np.intersect1d(clients, holdout).size
        for a, b in zip(split.parts, first):
            np.testing.assert_array_equal(a, b)
            assert len(set(ds.y_train[a].tolist())) == 1          # D stays balanced: 1-class clients hold one class
        counts = np.bincount(ds.y_train[split.server_idx], minlength=10)
        assert counts.max() - counts.min() <= 1                  # uniform over the 10 classes
    assert len(splits[0.2].groups["partition/server"]["samples"]) == 1


def test_fraction_with_holdout_zero_removes_only_the_set():
    split = split_dataset(config.from_dict({"seed": 2, "partition": {"clients": 10, "scheme": "iid"},
                                            "server_data": {"fraction": 0.25, "source": "holdout"}}), Labels())
    assert len(split.server_idx) == 200 and sum(len(p) for p in split.parts) == 800


def test_zhao_split_errors_name_the_keys():
    with pytest.raises(ConfigError, match="server_data.fraction.*either server_data.size"):
        config.from_dict({"server_data": {"size": 10, "fraction": 0.1}})
    with pytest.raises(ConfigError, match="server_data.holdout.*source = 'holdout'"):
        config.from_dict({"server_data": {"holdout": 100}})
    with pytest.raises(ConfigError, match="server_data.size.*<= server_data.holdout"):
        config.from_dict({"server_data": {"size": 200, "holdout": 100, "source": "holdout"}})
    with pytest.raises(ConfigError, match=r"server_data.fraction = 1.0 \(a set of 600 samples\).*holdout"):
        split_dataset(zhao_cfg(1.0, scheme="iid"), Labels())
    with pytest.raises(ConfigError, match="server_data.holdout = 1000"):
        split_dataset(zhao_cfg(0.1, holdout=1000), Labels())


def test_datashare_accepts_a_set_given_by_fraction():
    cfg = config.from_dict({"algorithm": {"name": "datashare"},
                            "server_data": {"fraction": 0.1, "holdout": 400, "source": "holdout"}})
    from fedmpi.algorithms import lookup

    lookup("datashare").check(cfg, VecModel(2))
    with pytest.raises(ConfigError, match="server_data.size"):
        lookup("datashare").check(config.from_dict({"algorithm": {"name": "datashare"}}), VecModel(2))


# --- partition scheme `groups` -------------------------------------------------------------------------------

def test_groups_partition_by_hand():
    cfg = config.from_dict({"seed": 1, "partition": {"clients": 5, "scheme": "groups", "groups": [
        {"clients": 3, "labels": [1, 2, 5]}, {"clients": 2, "labels": [2]}]}, "server": {"clients_per_round": 5}})
    ds = Labels()
    parts = partition(ds, cfg.partition, cfg.seed)
    held = [set(ds.y_train[p].tolist()) for p in parts]
    assert held == [{1, 2, 5}] * 3 + [{2}] * 2
    # Label 2 (100 samples) is split among all 5 clients, labels 1 and 5 among the first 3.
    assert [int((ds.y_train[p] == 2).sum()) for p in parts] == [20] * 5
    assert [int((ds.y_train[p] == 1).sum()) for p in parts[:3]] == [34, 33, 33]
    everything = np.concatenate(parts)
    assert len(everything) == len(set(everything.tolist())) == 300


def test_groups_partition_with_samples_per_client_by_hand():
    cfg = config.from_dict({"seed": 1, "partition": {"clients": 4, "scheme": "groups", "samples_per_client": 30,
                                                     "groups": [[2, [0, 1, 2, 3]], [2, [2]]]},
                            "server": {"clients_per_round": 4}})
    ds = Labels()
    parts = partition(ds, cfg.partition, cfg.seed)
    assert [len(p) for p in parts] == [30] * 4
    # 30 over 4 labels: 8, 8, 7, 7 (the first labels take the remainder); the second group 30 of label 2.
    assert [np.bincount(ds.y_train[p], minlength=4).tolist() for p in parts] == [[8, 8, 7, 7]] * 2 + [[0, 0, 30, 0]] * 2
    assert len(set(np.concatenate(parts).tolist())) == 120
    short = config.from_dict({"partition": {"clients": 4, "scheme": "groups", "samples_per_client": 60,
                                            "groups": [[2, [0, 1, 2, 3]], [2, [2]]]},
                              "server": {"clients_per_round": 4}})
    with pytest.raises(ConfigError, match="need 150 samples of label 2"):
        partition(ds, short.partition, short.seed)


def test_groups_partition_is_validated():
    with pytest.raises(ConfigError, match="add up to partition.clients"):
        config.PartitionConfig(clients=4, scheme="groups", groups=[{"clients": 3, "labels": [1]}])
    with pytest.raises(ConfigError, match="partition.groups"):
        config.PartitionConfig(clients=4, scheme="groups", groups=[{"clients": 4, "labels": []}])
    with pytest.raises(ConfigError, match="label 12 is not in the training pool"):
        partition(Labels(), config.PartitionConfig(clients=2, scheme="groups", groups=[[2, [12]]]), 0)
