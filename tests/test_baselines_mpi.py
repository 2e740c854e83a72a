"""The baselines end to end under mpiexec: the same results at -n 1 and -n 3, truthful byte counts, and a
bit-identical continuation from a checkpoint.

Each launch pays the torch import on every rank, so one launch per rank count (shared with other files:
tests/session_runs.py) runs everything in sequence: a driver calls `fedmpi.cli.main(["run", CONFIG, ...])`
once per command inside the same MPI job, which is exactly what `fedmpi run CONFIG ...` does. The -n 3
launch also runs the FedAvg reference and, for the baselines with state, two rounds with a checkpoint
after each, then `--resume rounds=3`.
(Most of each run's time is loading mnist5k, so the list is kept short.)
"""

import h5py
import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, small_config, write_config

pytestmark = pytest.mark.mpi

# The reference every baseline is compared with, run at -n 3 only.
FEDAVG = {"algorithm": {"name": "fedavg"}}
# name -> sections that differ from small_config
RUNS = {
    "fedprox": {"algorithm": {"name": "fedprox", "mu": 0.1}},
    "scaffold": {"algorithm": {"name": "scaffold"}},
    "feddyn": {"algorithm": {"name": "feddyn", "alpha": 0.01}},
    "fednova": {"algorithm": {"name": "fednova"},
                "client": {"lr": 0.05, "batch_size": 20, "epochs": 1, "momentum": 0.5}},
    # MOON needs a projection head: the smallest CNN, on an IID split with momentum so that three rounds
    # already move it clearly above chance.
    "moon": {"algorithm": {"name": "moon", "mu": 1.0, "tau": 0.5},
             "model": {"name": "simple_cnn", "projection": 16},
             "partition": {"clients": 12, "scheme": "iid"},
             "client": {"lr": 0.05, "batch_size": 20, "epochs": 1, "momentum": 0.9}},
}
# Test accuracy each run must pass after its three rounds (chance is 0.1).
MIN_ACC = {name: 0.5 for name in RUNS} | {"moon": 0.2}
# The baselines with client or server state (FedProx and FedNova resume from the global vector alone).
RESUMED = ("scaffold", "feddyn", "moon")
RANKS = (1, 3)


@session_runs.plan
def baseline_runs(base):
    """The commands of each rank count (tests/session_runs.py: in the launches shared with other files)."""
    steps, runs = {}, {}
    for n in RANKS:
        names = {**RUNS, "fedavg": FEDAVG} if n == 3 else RUNS
        steps[n] = [["run", write_config(base / f"{name}-n{n}.yaml", small_config(base / f"n{n}" / name, **sections))]
                    for name, sections in names.items()]
        if n == 3:
            for name in RESUMED:
                part = write_config(base / f"{name}-part.yaml", small_config(
                    base / "resumed" / name, **RUNS[name], rounds=2, checkpoint={"every": 1, "keep": 2}))
                steps[n] += [["run", part], ["run", part, "--resume", "rounds=3"]]
        runs[n] = {name: base / f"n{n}" / name for name in names}
    runs["resumed"] = {name: base / "resumed" / name for name in RESUMED}
    return steps, runs


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, baseline_runs)


@pytest.mark.parametrize("name", list(RUNS))
def test_same_results_at_one_and_three_ranks(runs, name):
    ref, ref_attrs = read_metrics(runs[1][name])
    got, attrs = read_metrics(runs[3][name])
    assert ref_attrs["status"] == attrs["status"] == "finished"
    assert attrs["world_size"] == 3 and len(got["round"]) == 3
    np.testing.assert_allclose(got["test_acc"], ref["test_acc"], rtol=1e-5)
    np.testing.assert_allclose(got["test_loss"], ref["test_loss"], rtol=1e-5)
    np.testing.assert_allclose(read_global(runs[3][name]), read_global(runs[1][name]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", list(RUNS))
def test_every_baseline_learns(runs, name):
    metrics, _ = read_metrics(runs[3][name])
    assert np.all(np.isfinite(metrics["test_loss"])) and metrics["test_acc"][-1] > MIN_ACC[name]


def test_scaffold_moves_two_vectors_each_way(runs):
    avg, _ = read_metrics(runs[3]["fedavg"])
    scaffold, _ = read_metrics(runs[3]["scaffold"])
    assert np.array_equal(scaffold["uploads"], avg["uploads"]) and np.all(avg["bytes_up"] > 0)
    assert np.array_equal(scaffold["bytes_up"], 2 * avg["bytes_up"])
    assert np.array_equal(scaffold["bytes_down"], 2 * avg["bytes_down"])
    for name in ("fedprox", "feddyn", "fednova"):
        other, _ = read_metrics(runs[3][name])
        assert np.array_equal(other["bytes_up"], avg["bytes_up"]), name


def test_scaffold_first_round_is_fedavg_then_differs(runs):
    avg, _ = read_metrics(runs[3]["fedavg"])
    scaffold, _ = read_metrics(runs[3]["scaffold"])
    assert scaffold["test_acc"][0] == avg["test_acc"][0]
    np.testing.assert_allclose(scaffold["test_loss"][0], avg["test_loss"][0], rtol=1e-6)
    assert not np.allclose(read_global(runs[3]["scaffold"]), read_global(runs[3]["fedavg"]), rtol=1e-3)


@pytest.mark.parametrize("name", RESUMED)
def test_resume_from_a_checkpoint_is_bit_identical(runs, name):
    full, _ = read_metrics(runs[3][name])
    resumed, attrs = read_metrics(runs["resumed"][name])
    assert attrs["status"] == "finished" and len(resumed["round"]) == 3
    for metric in ("test_acc", "test_loss", "train_loss", "bytes_up"):
        assert np.array_equal(resumed[metric], full[metric]), metric
    assert np.array_equal(read_global(runs["resumed"][name]), read_global(runs[3][name]))


# What each stateful baseline must have put into its checkpoints (docs/explanation/algorithms.md "Baselines").
CHECKPOINTED = {"scaffold": ("c", "c_i"), "feddyn": ("h", "g_i"), "moon": (None, "prev")}


@pytest.mark.parametrize("name", list(CHECKPOINTED))
def test_checkpoint_holds_the_baselines_state(runs, name):
    server_key, client_key = CHECKPOINTED[name]
    with h5py.File(runs["resumed"][name] / "ckpt" / "ckpt-2.h5", "r", locking=False) as f:
        dim = f["global"].shape[0]
        if server_key:
            assert f["server"][server_key].dtype == np.float32 and np.any(f["server"][server_key][()] != 0)
        clients = f["clients"]
        # Five clients a round for two rounds: at least five distinct clients trained, and only they have state.
        assert 5 <= len(clients) <= 10
        for cid in clients:
            vec = clients[cid][client_key][()]
            assert vec.dtype == np.float32 and 0 < len(vec) <= dim and np.any(vec != 0)
