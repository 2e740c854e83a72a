"""Local test splits and local evaluation (issue 24): the stratified hold-out, its refusals, LEAF users' own
test samples, the local figures on hand-computed numbers, and a tiny run's local evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from fedmpi import config
from fedmpi.core.errors import ConfigError
from fedmpi.data.dataset import Dataset
from fedmpi.data.local_test import hold_out, local_test_split, stratified_counts
from fedmpi.data.server_set import split_dataset as split_with_sections
from fedmpi.round.local_eval import local_figures


def test_stratified_counts_largest_remainder_by_hand():
    # 10 samples: 6 of label 0, 3 of label 1, 1 of label 2; k = 3: exact shares 1.8, 0.9, 0.3 -> 1, 0, 0,
    # then the two largest remainders (0.9 of label 1, 0.8 of label 0) get one each: 2, 1, 0
    labels = np.array([0] * 6 + [1] * 3 + [2])
    assert stratified_counts(labels, 3) == {0: 2, 1: 1, 2: 0}
    assert stratified_counts(np.array([4, 4, 4]), 2) == {4: 2}
    assert sum(stratified_counts(labels, 7).values()) == 7


def test_hold_out_is_seeded_per_client_stratified_and_disjoint():
    labels = np.array([0, 1] * 50)
    idx = np.arange(100, dtype=np.int64)
    train, test = hold_out(0, 3, idx, labels, 0.2)
    assert len(test) == 20 and len(train) == 80
    assert np.array_equal(np.sort(np.concatenate([train, test])), idx)
    assert np.bincount(labels[test]).tolist() == [10, 10]       # stratified: both labels give their share
    again = hold_out(0, 3, idx, labels, 0.2)[1]
    other = hold_out(0, 4, idx, labels, 0.2)[1]
    assert np.array_equal(again, test) and not np.array_equal(other, test)


def _dataset(n=60, users=None, test_users=None):
    g = np.random.default_rng(0)
    return Dataset("toy", g.normal(size=(n, 3)).astype(np.float32), np.arange(n) % 3,
                   g.normal(size=(9, 3)).astype(np.float32), np.arange(9) % 3, 3, users=users, test_users=test_users)


def _cfg(partition, **sections):
    return config.from_dict({"partition": partition, "server": {"clients_per_round": 1}, **sections})


def split_dataset(cfg, ds):
    """The split of `cfg`'s sections (the data package takes sections, not the config)."""
    return split_with_sections(ds, cfg.partition, cfg.server_data, cfg.seed, cfg.eval.local_every)


def test_local_test_zero_changes_nothing_and_a_fraction_records_the_sizes():
    ds = _dataset()
    plain = split_dataset(_cfg({"clients": 4, "scheme": "iid"}), ds)
    held = split_dataset(_cfg({"clients": 4, "scheme": "iid", "local_test": 0.25}), ds)
    assert plain.local_test is None and "partition/local_test" not in plain.groups
    sizes = held.groups["partition/local_test"]["samples"]
    assert sizes.tolist() == [4, 4, 4, 4]                      # round(0.25 * 15)
    for before, after, test in zip(plain.parts, held.parts, held.local_test.parts):
        assert np.array_equal(np.sort(np.concatenate([after, test])), before)
    assert held.groups["partition"]["samples"].tolist() == [11, 11, 11, 11]


def test_local_test_refusals_name_the_keys():
    ds = _dataset(n=8)
    with pytest.raises(ConfigError, match="partition.local_test = 0.5: client 0 has 1 sample"):
        split_dataset(_cfg({"clients": 8, "scheme": "iid", "local_test": 0.5}), ds)
    with pytest.raises(ConfigError, match=r"eval.local_every = 2: .*partition.local_test"):
        split_dataset(_cfg({"clients": 2, "scheme": "iid"}, eval={"local_every": 2}), ds)
    with pytest.raises(ConfigError, match="partition.local_test"):
        config.from_dict({"partition": {"local_test": 1.0}})
    with pytest.raises(ConfigError, match="eval.finetune_steps"):
        config.from_dict({"eval": {"finetune_steps": 3}})


def test_leaf_users_keep_their_own_test_samples():
    users = [np.arange(0, 30), np.arange(30, 60)]
    test_users = [np.array([0, 2, 4]), np.array([1, 3])]
    ds = _dataset(users=users, test_users=test_users)
    cfg = _cfg({"clients": 2, "scheme": "natural"}, data={"name": "femnist"})
    parts, local = local_test_split(cfg.partition, cfg.seed, ds, users)
    assert local.source == "test" and [p.tolist() for p in local.parts] == [[0, 2, 4], [1, 3]]
    assert parts is users
    with pytest.raises(ConfigError, match="partition.local_test = 0.1: data.name = 'toy'"):
        local_test_split(config.PartitionConfig(clients=2, scheme="natural", local_test=0.1), 0, ds, users)


def test_leaf_test_users_matched_by_name():
    from fedmpi.data.leaf import _test_users

    got = _test_users(["a", "b", "c"], [np.array([0, 1]), np.array([2])], ["b", "a"])
    assert [g.tolist() for g in got] == [[2], [0, 1], []]


def test_local_figures_on_hand_computed_numbers():
    acc = [0.5, 1.0, 0.25, 0.75]
    sizes = [2, 4, 4, 10]
    glob = [0.5, 0.5, 0.5, 0.5]
    f = local_figures(acc, [1.0, 0.0, 2.0, 0.5], glob, sizes)
    assert f["local_acc_mean"] == pytest.approx((1 + 4 + 1 + 7.5) / 20)
    assert f["local_acc_unweighted"] == pytest.approx(0.625)
    assert f["local_acc_std"] == pytest.approx(np.sqrt(((-.125) ** 2 + .375 ** 2 + .375 ** 2 + .125 ** 2) / 4))
    assert f["local_acc_worst10"] == 0.25 and f["local_acc_worst"] == 0.25       # k = max(1, floor(0.4)) = 1
    assert f["local_below_global"] == 0.25          # only 0.25 < 0.5 (0.5 is not below 0.5)
    assert f["local_loss_mean"] == pytest.approx((2 + 0 + 8 + 5) / 20)
    # 20 clients: the worst 10% are the two lowest
    f = local_figures(np.arange(20) / 20, np.zeros(20), np.zeros(20), np.ones(20))
    assert f["local_acc_worst10"] == pytest.approx(0.025)
    assert np.isnan(local_figures([], [], [], [])["local_acc_mean"])


def _run(**eval_keys):
    from fedmpi.run.api import simulate

    return simulate({"seed": 1, "rounds": 4, "data": {"name": "mnist5k"},
                     "partition": {"clients": 8, "local_test": 0.2}, "server": {"clients_per_round": 3},
                     "model": {"name": "lr"}, "client": {"steps": 4}, "runtime": {"progress": "off", "threads": 1},
                     "eval": {"local_every": 2, **eval_keys}})


def test_local_evaluation_of_fedavg_is_the_global_model_on_each_split():
    import torch

    from fedmpi.core.train import evaluate

    res = _run(local_clients="all")
    exp = res.experiment
    acc = res.clients["local_acc"]
    assert np.isnan(acc[[0, 2]]).all() and not np.isnan(acc[[1, 3]]).any()     # rounds 1 and 3 (the last)
    # FedAvg evaluates the global model: check one client's figure against a direct evaluation
    exp.flat.load(torch.from_numpy(res.model))
    idx = torch.from_numpy(exp.split.local_test.parts[5])
    direct, _ = evaluate(exp.flat.module, exp.data.train[0][idx], exp.data.train[1][idx], 100)
    assert acc[3, 5] == pytest.approx(direct)
    assert res.metrics["local_below_global"][3] == 0.0
    sel = _run()        # `selected`: only the round's clients
    chosen = res.clients["selected"][3] > 0
    assert np.array_equal(~np.isnan(sel.clients["local_acc"][3]), chosen)


def test_finetuning_is_discarded_and_moves_the_local_figures():
    plain, tuned = _run(local_clients="all"), _run(local_clients="all", finetune_steps=5)
    assert np.array_equal(plain.model, tuned.model)          # fine-tuning changes nothing that is kept
    assert not np.array_equal(plain.clients["local_acc"][3], tuned.clients["local_acc"][3])


def test_report_clients_and_export_carry_the_local_figures(tmp_path, capsys):
    """A real run file: `fedmpi report --clients` prints the last local evaluation's distribution as logged,
    `--plot` draws its CDF, and `fedmpi export --csv` carries every local figure."""
    import csv
    import io

    from conftest import small_config, write_config

    from fedmpi.analysis import load_runs, report_command
    from fedmpi.cli import main as fedmpi_main

    cfg = small_config(tmp_path / "fedper", rounds=2, model={"name": "mlp", "hidden": 8},
                       algorithm={"name": "fedper"}, partition={"clients": 6, "scheme": "shards", "local_test": 0.2},
                       server={"clients_per_round": 3}, eval={"local_every": 2, "local_clients": "all"},
                       runtime={"threads": 1, "progress": "off"})
    assert fedmpi_main(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == 0
    run_file = tmp_path / "fedper" / "run.h5"
    out = io.StringIO()
    assert report_command([run_file], clients=True, plot=str(tmp_path / "p.png"), out=out) == 0
    text = out.getvalue()
    metrics = load_runs([str(run_file)])[0].metrics
    line = next(row for row in text.splitlines() if row.startswith("fedper") and "finished" not in row)
    cells = line.split()
    assert cells[1] == "1" and cells[2] == "6"        # round index 1, six clients evaluated
    assert cells[3] == f"{metrics['local_acc_mean'][1]:.4f}" and cells[5] == f"{metrics['local_acc_worst10'][1]:.4f}"
    assert (tmp_path / "p-fedper-clients.png").stat().st_size > 0
    assert fedmpi_main(["export", str(run_file), "--csv", str(tmp_path / "e.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "e.csv")))
    assert float(rows[1]["local_acc_worst10"]) == pytest.approx(metrics["local_acc_worst10"][1])
    assert rows[0]["local_acc_mean"] == ""          # not evaluated in round 0
    capsys.readouterr()
