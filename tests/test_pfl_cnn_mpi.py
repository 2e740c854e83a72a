"""W5's setup under MPI (issue 30), in the launches at -n 1 and -n 3 shared with other files
(tests/session_runs.py): pfl-research's simple_cnn (`model.name: pfl_cnn`, two dropout layers) with
`server.weighting: uniform` on tiny CIFAR-10 batches. Dropout draws from each client's own seeded generator,
so every round's model is bit-identical at -n 1 and -n 3 (/metrics/model_sha256), as is the final model."""

from __future__ import annotations

import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, write_config
from dataset_files import write_cifar

ROUNDS = 2


def _config(out, root):
    return {"seed": 3, "rounds": ROUNDS, "out": str(out), "data": {"name": "cifar10", "root": str(root)},
            "partition": {"clients": 6, "scheme": "iid"}, "model": {"name": "pfl_cnn"},
            "client": {"lr": 0.1, "batch_size": 10, "epochs": 1},
            "server": {"clients_per_round": 4, "weighting": "uniform"}, "eval": {"every": 1},
            "runtime": {"threads": 1, "progress": "lines"}}


@session_runs.per_n
def _launch(base, n):
    write_cifar(base / "data", n_train=60, n_test=20)
    path = write_config(base / "w5.yaml", _config(base / "w5", base / "data"))
    return [[path]], base / "w5"


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, _launch)


@pytest.mark.mpi
def test_pfl_cnn_with_dropout_and_uniform_weights_is_the_same_at_one_and_three_ranks(runs):
    (m1, _), (m3, _) = read_metrics(runs[1]), read_metrics(runs[3])
    assert len(m1["model_sha256"]) == ROUNDS
    assert list(m1["model_sha256"]) == list(m3["model_sha256"])
    np.testing.assert_array_equal(m1["test_acc"], m3["test_acc"])
    np.testing.assert_array_equal(read_global(runs[1]), read_global(runs[3]))
