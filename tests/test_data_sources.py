"""Data sources read small files written here in the official formats; bad roots exit 2 naming the file."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, write_config
from dataset_files import VOCAB, emnist_names, write_cifar, write_idx, write_leaf, write_mnist_family

from fedmpi import config
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.data import load_dataset
from fedmpi.data.leaf import encode_chars


def cfg_for(name, root, **data):
    return config.from_dict({"data": {"name": name, "root": str(root), **data},
                             "partition": {"clients": 3, "scheme": "iid"}, "server": {"clients_per_round": 1}})


@pytest.mark.parametrize("name, subdir", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_family_reads_idx_files(tmp_path, name, subdir):
    written = write_mnist_family(tmp_path, subdir, n_train=50, n_test=20)
    ds = load_dataset(cfg_for(name, tmp_path))
    assert ds.x_train.shape == (50, 1, 28, 28) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (20, 1, 28, 28) and ds.num_classes == 10
    assert np.array_equal(ds.y_train, written["train"][1]) and ds.y_train.dtype == np.int64
    # Normalisation is monotone per pixel: the written bright rows stay the brightest values.
    img, raw = ds.x_train[7, 0], written["train"][0][7]
    assert np.array_equal(np.argsort(img, axis=None, kind="stable"), np.argsort(raw, axis=None, kind="stable"))
    assert abs(float(ds.x_train.mean())) < 3


def test_emnist_split_is_transposed_back_and_classes_subset(tmp_path):
    written = write_mnist_family(tmp_path, "EMNIST", n_train=94, n_test=47, classes=47,
                                 names=emnist_names("balanced"))
    ds = load_dataset(cfg_for("emnist", tmp_path, split="balanced"))
    assert ds.num_classes == 47 and len(ds.y_train) == 94
    raw = written["train"][0][5].astype(np.float32)
    # The files store images transposed; the loader swaps them back, so the bright row becomes a column.
    assert np.array_equal(np.argmax(ds.x_train[5, 0], axis=1), np.argmax(raw.T, axis=1))
    subset = load_dataset(cfg_for("emnist", tmp_path, split="balanced", classes=45))
    assert subset.num_classes == 45 and subset.y_train.max() == 44 and len(subset.y_train) == 90
    assert len(subset.y_test) == 45


def test_emnist_unknown_split_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="data.split = 'nope'.*balanced"):
        load_dataset(cfg_for("emnist", tmp_path, split="nope"))


@pytest.mark.parametrize("kind, classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_reads_pickled_batches(tmp_path, kind, classes):
    written = write_cifar(tmp_path, kind, n_train=120, n_test=30)
    ds = load_dataset(cfg_for(kind, tmp_path))
    assert ds.x_train.shape == (120, 3, 32, 32) and ds.num_classes == classes
    assert np.array_equal(ds.y_train, written["train"][1]) and np.array_equal(ds.y_test, written["test"][1])
    # Pixel (h, w, c) of the HWC image written lands at [c, h, w], normalised with that channel's statistics.
    images = written["train"][0]
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    if kind == "cifar10":
        for n, h, w, c in [(0, 0, 0, 0), (17, 3, 30, 2), (119, 31, 5, 1)]:
            expected = (images[n, h, w, c] / 255.0 - mean[c]) / std[c]
            assert ds.x_train[n, c, h, w] == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_femnist_users_and_pixels(tmp_path):
    written = write_leaf(tmp_path, "femnist")
    ds = load_dataset(cfg_for("femnist", tmp_path))
    assert ds.x_train.shape == (19, 1, 28, 28) and ds.num_classes == 62 and len(ds.y_test) == 7
    assert [len(u) for u in ds.users] == [6, 9, 4]
    users, data = written["train"]
    assert np.array_equal(ds.y_train[ds.users[1]], data[users[1]]["y"])
    assert abs(float(ds.x_train.mean())) < 1e-4 and float(ds.x_train.std()) == pytest.approx(1.0, rel=1e-3)


def test_shakespeare_tokens_and_next_char(tmp_path):
    written = write_leaf(tmp_path, "shakespeare")
    ds = load_dataset(cfg_for("shakespeare", tmp_path))
    assert ds.x_train.shape == (19, 80) and ds.x_train.dtype == np.int64 and ds.num_classes == 80
    users, data = written["train"]
    first = data[users[0]]
    assert "".join(VOCAB[i] for i in ds.x_train[0]) == first["x"][0]
    assert VOCAB[ds.y_train[0]] == first["y"][0]
    assert encode_chars(["\u00e9 "]).tolist() == [VOCAB.index(" ")] * 2     # unknown -> space


def test_natural_partition_uses_leaf_users(tmp_path):
    write_leaf(tmp_path, "femnist")
    from fedmpi.data.partition import partition

    cfg = config.from_dict({"data": {"name": "femnist", "root": str(tmp_path)},
                            "partition": {"clients": 3, "scheme": "natural"}, "server": {"clients_per_round": 1}})
    ds = load_dataset(cfg)
    parts = partition(ds, cfg.partition, cfg.seed)
    assert [p.tolist() for p in parts] == [u.tolist() for u in ds.users]


@pytest.mark.parametrize("name, expected", [
    ("mnist", "train-images-idx3-ubyte"), ("emnist", "emnist-balanced-train-images-idx3-ubyte"),
    ("cifar10", "data_batch_1"), ("cifar100", "cifar-100-python"), ("femnist", "train/*.json"),
    ("shakespeare", "train/*.json")])
def test_missing_files_name_what_was_expected_where(tmp_path, name, expected):
    with pytest.raises(InputError) as info:
        load_dataset(cfg_for(name, tmp_path / "empty"))
    message = str(info.value)
    assert expected in message and str(tmp_path / "empty") in message
    assert "download" in message or "preprocess.sh" in message


def test_unset_root_says_how_to_set_it():
    cfg = config.from_dict({"data": {"name": "cifar10"}, "partition": {"clients": 2},
                            "server": {"clients_per_round": 1}})
    with pytest.raises(InputError, match="data.root is not set.*cifar-10-batches-py"):
        load_dataset(cfg)


def test_malformed_files_are_input_errors(tmp_path):
    write_mnist_family(tmp_path, "MNIST", n_train=20, n_test=10)
    (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"not an idx file")
    with pytest.raises(InputError, match="MNIST/raw"):
        load_dataset(cfg_for("mnist", tmp_path))
    write_leaf(tmp_path / "leaf", "femnist")
    (tmp_path / "leaf" / "test" / "all_data_0_niid_test.json").write_text('{"users": ["a"]')
    with pytest.raises(InputError, match="all_data_0_niid_test.json"):
        load_dataset(cfg_for("femnist", tmp_path / "leaf"))


def test_labels_out_of_range_are_input_errors(tmp_path):
    write_mnist_family(tmp_path, "MNIST", n_train=20, n_test=10)
    write_idx(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte", np.full(10, 12))
    with pytest.raises(InputError, match="test labels must lie in 0..9"):
        load_dataset(cfg_for("mnist", tmp_path))


def test_augment_on_non_images_is_a_config_error(tmp_path):
    write_leaf(tmp_path, "shakespeare")
    with pytest.raises(ConfigError, match="data.augment"):
        load_dataset(cfg_for("shakespeare", tmp_path, augment=True))


def _dry_run(tmp_path, mapping):
    path = write_config(tmp_path / "cfg.yaml", mapping)
    return subprocess.run([sys.executable, "-m", "fedmpi", "run", str(path), "--dry-run"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_cli_dry_run_exits_2_naming_the_missing_file(tmp_path):
    write_mnist_family(tmp_path / "data", "MNIST", n_train=20, n_test=10)
    (tmp_path / "data" / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    proc = _dry_run(tmp_path, {"data": {"name": "mnist", "root": str(tmp_path / "data")},
                               "partition": {"clients": 2, "scheme": "iid"}, "server": {"clients_per_round": 1}})
    assert proc.returncode == 2, proc.stderr
    # Only the file that is actually missing is named as expected, with the folder it was expected in.
    assert f"expected t10k-labels-idx1-ubyte in {tmp_path / 'data' / 'MNIST' / 'raw'} " in proc.stderr


def test_cli_dry_run_prints_partition_and_server_set(tmp_path, capsys):
    from fedmpi.cli import main  # in-process: the subprocess path is covered above

    write_cifar(tmp_path / "data", "cifar10", n_train=200, n_test=20)
    path = write_config(tmp_path / "cfg.yaml", {
        "data": {"name": "cifar10", "root": str(tmp_path / "data")},
        "partition": {"clients": 4, "scheme": "labels", "labels_per_client": 2},
        "server_data": {"size": 30, "scheme": "classes", "classes": 3, "source": "holdout"},
        "server": {"clients_per_round": 2}})
    assert main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "classes per client min 2 / max 2" in out
    assert "server set: 30 samples (classes, holdout), 3 classes" in out
