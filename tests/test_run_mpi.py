"""End to end under mpiexec: same results at any -n, repeatable runs, failures that end the job."""

import numpy as np
import pytest
from conftest import (
    MPI_TIMEOUT_S,
    read_clients,
    read_global,
    read_metrics,
    run_fedmpi,
    run_steps,
    same,
    small_config,
    write_config,
)

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def mlp_runs(tmp_path_factory):
    """One mlp config run at -n 1, 2, 3, and once more at -n 3 in a later launch that first runs
    test_central_sgd_learns's config (four launches: each costs more than these runs). The repeat is a
    fresh process that has run another experiment before, so the identity also says nothing carries over
    from one run to the next inside a process."""
    base = tmp_path_factory.mktemp("mlp")
    runs = {}
    for key, n in [("n1", 1), ("n2", 2), ("n3", 3), ("n3again", 3)]:
        out = base / key
        cfg = write_config(base / f"{key}.yaml", small_config(
            out, model={"name": "mlp", "hidden": 32}, client={"lr": 0.05, "batch_size": 10, "steps": 8},
            rounds=4, eval={"every": 1}))
        if key == "n3again":
            central = base / "central"
            central_cfg = write_config(base / "central.yaml",
                                       small_config(central, algorithm={"name": "central"}, rounds=3))
            proc = run_steps(n, [[central_cfg], [cfg]])
            runs["central"] = (central, proc)
        else:
            proc = run_fedmpi(n, "run", cfg)
        runs[key] = (out, proc)
    return runs


def test_same_accuracy_and_global_vector_at_any_rank_count(mlp_runs):
    ref_metrics, _ = read_metrics(mlp_runs["n1"][0])
    ref_global = read_global(mlp_runs["n1"][0])
    assert len(ref_metrics["round"]) == 4 and ref_metrics["test_acc"][-1] > 0.3
    for key in ("n2", "n3"):
        metrics, attrs = read_metrics(mlp_runs[key][0])
        assert np.array_equal(metrics["test_acc"], ref_metrics["test_acc"]), key
        # the same bits at a fixed runtime.threads (docs/explanation/determinism.md): each round's fingerprint and
        # the final vector
        assert same(metrics["model_sha256"], ref_metrics["model_sha256"]), key
        assert np.array_equal(read_global(mlp_runs[key][0]), ref_global), key
        assert attrs["world_size"] == int(key[1])


def test_same_run_twice_gives_identical_metrics(mlp_runs):
    a, _ = read_metrics(mlp_runs["n3"][0])
    b, _ = read_metrics(mlp_runs["n3again"][0])
    for name in a:
        if name != "wall_s":
            assert same(a[name], b[name]), name
    assert np.array_equal(read_global(mlp_runs["n3"][0]), read_global(mlp_runs["n3again"][0]))


def test_run_file_holds_the_contract_layout(mlp_runs):
    import h5py

    with h5py.File(mlp_runs["n3"][0] / "run.h5", "r") as f:
        assert f.attrs["status"] == "finished" and "seed: 1" in f.attrs["config"]
        for name in ("round", "test_acc", "test_loss", "train_loss", "wall_s", "bytes_up", "bytes_down", "uploads"):
            assert f["metrics"][name].shape == (4,), name
        dim = f.attrs["dim"]
        assert np.all(f["metrics/uploads"][()] == 5)
        assert np.all(f["metrics/bytes_up"][()] == 5 * 4 * dim)
        assert np.all(f["metrics/bytes_down"][()] == 5 * 4 * dim)
        assert f["partition/labels"].shape == (12, 10) and f["partition/samples"][()].sum() == 4000
        # Per-client rows name the round's 5 clients; the dense view has all 12.
        assert f["clients/ids"].shape == (4, 5) and f["clients"].attrs["num_clients"] == 12
        assert f["model/global"].shape == (dim,)
    selected = read_clients(mlp_runs["n3"][0])["selected"]
    assert selected.shape == (4, 12) and np.all(selected.sum(axis=1) == 5)


def test_progress_lines_in_a_batch_log(mlp_runs):
    err = mlp_runs["n3"][1].stderr
    assert "round 4/4" in err and "acc " in err and "s/round" in err


def test_central_sgd_learns(mlp_runs):
    out = mlp_runs["central"][0]        # run at -n 3 by the mlp_runs fixture
    metrics, attrs = read_metrics(out)
    assert attrs["status"] == "finished" and metrics["test_acc"][-1] > 0.6
    assert np.all(metrics["uploads"] == 1)


@pytest.mark.parametrize("n,fault", [(3, "2:1"), (1, "0:1")])
def test_exception_on_one_rank_ends_the_job_and_marks_the_run_failed(tmp_path, n, fault):
    out = tmp_path / "fail"
    cfg = write_config(tmp_path / "f.yaml", small_config(out, rounds=6))
    # The job ends by itself: one that hung instead would run into the timeout (subprocess.TimeoutExpired
    # fails the test). No tighter wall-clock bound: the launch's start alone takes tens of seconds under load.
    proc = run_fedmpi(n, "run", cfg, env={"FEDMPI_INJECT_FAULT": fault}, check=False, timeout=MPI_TIMEOUT_S)
    assert proc.returncode != 0
    rank = fault.split(":")[0]
    assert f"rank {rank} failed: RuntimeError: injected fault" in proc.stderr
    metrics, attrs = read_metrics(out)
    assert attrs["status"] == "failed" and f"rank {rank} failed" in attrs["error"]
    assert len(metrics["round"]) == 1          # round 0 finished and was logged before the fault
