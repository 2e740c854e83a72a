"""The federated LoRA rules composed with client DP and secure aggregation (issue 54), on the LoRA plug-in model
of tests/lora_nets.py: each combination the rules allow runs at -n 1 and -n 3 to the same per-round model
fingerprints; the combinations a rule cannot run are refused (exit 2, naming why) before any file is written."""

from __future__ import annotations

import numpy as np
import pytest
import session_runs
from conftest import ROOT, read_global, read_metrics, write_config
from dataset_files import write_mnist_family

from fedmpi.cli import main

pytest.importorskip("peft")

ENV = {"PYTHONPATH": str(ROOT / "tests")}
DP = {"privacy": {"mechanism": "gaussian", "clip": 0.5, "noise_multiplier": 0.5}}
SECAGG = {"server": {"secure_aggregation": "secagg"}}
MEDIAN = {"server": {"aggregator": "median"}}
COMBOS = {
    "fedit-secagg": ({"name": "fedit", "product_gap": True}, SECAGG),
    "fedit-median": ({"name": "fedit"}, MEDIAN),
    "ffa_lora-dp": ({"name": "ffa_lora"}, DP),
    "fedsa_lora-secagg": ({"name": "fedsa_lora"}, SECAGG),
    "hetlora-dp": ({"name": "hetlora", "ranks": [2, 4], "aggregation": "mean", "prune_lambda": 0.1}, DP),
    "hetlora-median": ({"name": "hetlora", "ranks": [2, 4], "aggregation": "mean"}, MEDIAN),
    "flora-dp": ({"name": "flora", "ranks": [2, 4]}, DP),
    "flora-secagg": ({"name": "flora"}, SECAGG),
}


def config_of(data_root, algorithm, extra, out):
    cfg = {"seed": 5, "rounds": 3, "data": {"name": "mnist", "root": str(data_root)},
           "partition": {"clients": 7, "scheme": "iid"}, "model": {"name": "lora_nets:TinyLora"},
           "client": {"lr": 0.05, "batch_size": 8, "steps": 2}, "server": {"clients_per_round": 5},
           "eval": {"every": 1, "batch_size": 100}, "runtime": {"threads": 1, "progress": "off"},
           "algorithm": dict(algorithm), "out": str(out)}
    for key, value in extra.items():
        cfg.setdefault(key, {}).update(value)
    return cfg


@session_runs.plan
def lora_runs(base):
    write_mnist_family(base / "mnist", "MNIST", n_train=140, n_test=40)
    steps = {1: [], 3: []}
    for name, (algorithm, extra) in COMBOS.items():
        for n in steps:
            path = write_config(base / f"{name}-n{n}.yaml",
                                config_of(base / "mnist", algorithm, extra, base / f"n{n}" / name))
            steps[n].append([ENV, "run", path, "--overwrite"])
    return steps, base


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, lora_runs)


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(COMBOS))
def test_composed_rules_do_not_depend_on_the_rank_count(runs, name):
    one, attrs = read_metrics(runs / "n1" / name)
    three, attrs3 = read_metrics(runs / "n3" / name)
    assert attrs["status"] == attrs3["status"] == "finished" and attrs3["world_size"] == 3
    assert len(one["model_sha256"]) == 3
    assert np.array_equal(one["model_sha256"], three["model_sha256"]), name
    if "product_gap" in COMBOS[name][0] or COMBOS[name][0]["name"] == "flora":
        gaps = three["lora_product_gap"]
        assert np.all(np.isfinite(gaps)) and np.all(gaps > 0), gaps


@pytest.mark.mpi
def test_fedsa_lora_never_changes_the_global_b(runs):
    # Every B is personal: the server's B stays at its initialisation (peft's zeros), while FedAvg on the same
    # adapters moves it in the first round.
    from lora_nets import TinyLora

    from fedmpi.core.flat import FlatModel

    entries = FlatModel(TinyLora((1, 28, 28), 10)).entries
    b_entries = [(offset, numel) for name, offset, numel in entries if "lora_B" in name]
    assert b_entries
    for name, moved in (("fedsa_lora-secagg", False), ("fedit-secagg", True)):
        final = read_global(runs / "n3" / name)
        b_values = np.concatenate([final[o:o + n] for o, n in b_entries])
        assert bool(np.any(b_values != 0)) == moved, name


@pytest.mark.parametrize("algorithm,extra,words", [
    ({"name": "flora"}, {"server": {"aggregator": "median"}},
     "server.aggregator = 'median': needs an algorithm whose upload is one vector averaged by weight; "
     "algorithm.name = 'flora' is not one"),
    ({"name": "hetlora", "ranks": [2, 4]}, {"server": {"aggregator": "median"}},
     "algorithm.aggregation = 'sparsity': server.aggregator = 'median' weighs the uploads by their sample counts"),
    ({"name": "hetlora", "ranks": [2, 4]}, {"privacy": {"mechanism": "gaussian"}},
     "its sparsity weights ||B_k A_k||_F come from each client's training and are neither clipped nor bounded"),
    ({"name": "fedit", "product_gap": True}, {"server": {"aggregator": "krum"}},
     "algorithm.name = 'fedit' is not one"),
    ({"name": "flora"}, {"server": {"optimizer": "adam"}}, "server.optimizer = 'adam'"),
    ({"name": "hetlora", "ranks": [1, 2], "aggregation": "mean"}, {},
     "algorithm.ranks = [1, 2]: every rank must be in 1..4 and the largest 4, the model's LoRA rank"),
])
def test_what_a_rule_cannot_run_is_refused_before_any_file(tmp_path, capsys, monkeypatch, algorithm,
                                                                   extra, words):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    write_mnist_family(tmp_path / "mnist", "MNIST", n_train=40, n_test=10)
    out = tmp_path / "out"
    path = write_config(tmp_path / "c.yaml", config_of(tmp_path / "mnist", algorithm, extra, out))
    assert main(["run", str(path), "--dry-run"]) == 2       # the dry run refuses what the run would
    assert words in capsys.readouterr().err
    assert main(["run", str(path)]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()
