"""Every model trains a few steps on its data set under -n 1 and -n 3 with equal results.

All models run in one mpiexec launch per -n (tests/session_runs.py, shared with other files), on small files written in
the official formats, covering every loader, most partition schemes, a held-out server set and CIFAR
augmentation along the way.
"""


import h5py
import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, write_config
from dataset_files import emnist_names, write_cifar, write_leaf, write_mnist_family

pytestmark = pytest.mark.mpi

# name: (data section, partition section, model section, extra top-level sections)
RUNS = {
    "lr": ({"name": "mnist"}, {"clients": 4, "scheme": "iid"}, {"name": "lr"}, {}),
    "mlp": ({"name": "fashion_mnist"}, {"clients": 4, "scheme": "shards", "shards_per_client": 2},
            {"name": "mlp", "hidden": 16}, {}),
    "cnn_mnist": ({"name": "emnist", "split": "balanced", "classes": 45},
                  {"clients": 4, "scheme": "classes", "classes_per_client": 3}, {"name": "cnn_mnist"}, {}),
    "cnn2": ({"name": "femnist"}, {"clients": 3, "scheme": "natural"}, {"name": "cnn2"}, {}),
    "simple_cnn": ({"name": "cifar10", "augment": True}, {"clients": 4, "scheme": "labels", "labels_per_client": 3},
                   {"name": "simple_cnn", "projection": 16},
                   {"server_data": {"size": 20, "scheme": "classes", "classes": 4, "source": "holdout"}}),
    "resnet18_group": ({"name": "cifar100"}, {"clients": 4, "scheme": "quantity", "beta": 5.0, "min_samples": 8},
                       {"name": "resnet18", "norm": "group"}, {}),
    "resnet18_batch": ({"name": "cifar10"}, {"clients": 4, "scheme": "dirichlet", "beta": 1.0, "min_samples": 8},
                       {"name": "resnet18", "norm": "batch"}, {}),
    "lstm": ({"name": "shakespeare"}, {"clients": 3, "scheme": "natural"}, {"name": "lstm"}, {}),
}
ROOTS = {"mnist": "mnist", "fashion_mnist": "mnist", "emnist": "mnist", "cifar10": "cifar", "cifar100": "cifar",
         "femnist": "femnist", "shakespeare": "shakespeare"}


def write_data(base):
    write_mnist_family(base / "mnist", "MNIST", n_train=80, n_test=20)
    write_mnist_family(base / "mnist", "FashionMNIST", n_train=80, n_test=20, seed=1)
    write_mnist_family(base / "mnist", "EMNIST", n_train=188, n_test=47, classes=47, names=emnist_names("balanced"))
    write_cifar(base / "cifar", "cifar10", n_train=80, n_test=16)
    write_cifar(base / "cifar", "cifar100", n_train=200, n_test=16)
    write_leaf(base / "femnist", "femnist", users_train=(12, 9, 10), users_test=(3, 3, 2))
    write_leaf(base / "shakespeare", "shakespeare", users_train=(12, 9, 10), users_test=(3, 3, 2))


def run_config(base, name, n):
    data, partition, model, extra = RUNS[name]
    mapping = {
        "seed": 2, "rounds": 2, "out": str(base / f"n{n}" / name),
        "data": {**data, "root": str(base / ROOTS[data["name"]])},
        "partition": partition, "model": model,
        "client": {"lr": 0.05, "batch_size": 4, "steps": 2},
        "server": {"clients_per_round": 2},
        "eval": {"batch_size": 100},
        "runtime": {"threads": 1, "progress": "off"},
        **extra,
    }
    return write_config(base / f"{name}-n{n}.yaml", mapping)


@session_runs.plan
def zoo_runs(base):
    """Every model at -n 1 and -n 3 (tests/session_runs.py: in the launches shared with other files)."""
    write_data(base)
    return {n: [["run", run_config(base, name, n), "--overwrite"] for name in RUNS] for n in (1, 3)}, base


@pytest.fixture(scope="module")
def model_runs(request):
    return session_runs.result(request, zoo_runs)


@pytest.mark.parametrize("name", list(RUNS))
def test_model_gives_equal_results_at_n1_and_n3(model_runs, name):
    one, three = model_runs / "n1" / name, model_runs / "n3" / name
    m1, attrs1 = read_metrics(one)
    m3, attrs3 = read_metrics(three)
    assert attrs1["status"] == "finished" and attrs3["status"] == "finished"
    assert attrs1["world_size"] == 1 and attrs3["world_size"] == 3
    assert len(m1["round"]) == 2 and np.all(np.isfinite(m1["train_loss"])) and np.all(np.isfinite(m1["test_loss"]))
    assert np.array_equal(m1["test_acc"], m3["test_acc"])
    for key in ("train_loss", "test_loss", "uploads", "bytes_up"):
        np.testing.assert_allclose(m3[key], m1[key], rtol=1e-5, err_msg=key)
    g1, g3 = read_global(one), read_global(three)
    assert g1.shape == (attrs1["dim"],) and np.isfinite(g1).all()
    np.testing.assert_allclose(g3, g1, rtol=1e-5, atol=1e-7)


def test_run_file_holds_client_and_server_partitions(model_runs):
    with h5py.File(model_runs / "n3" / "simple_cnn" / "run.h5", "r") as f:
        samples, labels = f["partition/samples"][()], f["partition/labels"][()]
        assert labels.shape == (4, 10) and ((labels > 0).sum(axis=1) == 3).all()
        assert f["partition/server/samples"][()].tolist() == [20]
        server_labels = f["partition/server/labels"][()]
        assert server_labels.shape == (1, 10) and (server_labels > 0).sum() == 4
        # Held out from the clients' pool: per class, clients and server together hold at most the 8 written.
        both = (labels.sum(axis=0) > 0) & (server_labels[0] > 0)
        assert both.any() and np.all(labels.sum(axis=0) + server_labels[0] <= 8)
        assert samples.sum() <= 80 - 20
        assert f["partition/server/emd"][()][0] > 0.5
    with h5py.File(model_runs / "n1" / "lstm" / "run.h5", "r") as f:
        assert f["partition/samples"][()].tolist() == [12, 9, 10]
        assert f["partition/server/samples"][()].tolist() == [0]
