"""The research algorithms end to end under mpiexec: equivalences, -n independence, gating figures.

Every config runs at -n 1 and at -n 3 inside one launch per rank count (tools/run_batch.py).
"""

import h5py
import numpy as np
import pytest
import session_runs
from conftest import read_clients, read_global, read_metrics, small_config, write_config

pytestmark = pytest.mark.mpi

SERVER = {"size": 100, "scheme": "iid"}
CASES = {
    "fedavg": {},
    "fsl_gamma0": {"algorithm": {"name": "fsl", "gamma": 0.0}, "server_data": SERVER},
    "fsl": {"algorithm": {"name": "fsl", "gamma": 1.0}, "server_data": SERVER},
    "fedskip_delta1": {"algorithm": {"name": "fedskip", "delta": 1}},
    "fedskip": {"algorithm": {"name": "fedskip", "delta": 3}, "rounds": 6},
    "datashare": {"algorithm": {"name": "datashare", "alpha": 0.5, "warmup_epochs": 1},
                  "server_data": {"size": 400, "scheme": "iid", "source": "holdout"}},
    "safl_eps1": {"algorithm": {"name": "safl", "eps": 1.0}},
    "safl": {"algorithm": {"name": "safl", "eps": 0.5, "L": 5.0}},
    "safl_gated_nu0": {"algorithm": {"name": "safl", "eps": 0.5, "L": 5.0, "gating": True, "nu": 0.0}},
    "safl_gated": {"algorithm": {"name": "safl", "eps": 0.5, "L": 5.0, "gating": True, "nu": 20.0},
                   "partition": {"clients": 12, "scheme": "dirichlet", "beta": 0.1}, "rounds": 6},
}


@session_runs.plan
def research_runs(base):
    """Every case at -n 1 and -n 3 (tests/session_runs.py: in the launches shared with other files)."""
    out, steps = {}, {1: [], 3: []}
    for n in (1, 3):
        for name, sections in CASES.items():
            cfg = small_config(base / f"{name}-n{n}", **{"rounds": 4, **sections})
            steps[n].append(["run", write_config(base / f"{name}-n{n}.yaml", cfg), "--overwrite"])
            out[name, n] = base / f"{name}-n{n}"
    return steps, out


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, research_runs)


def metrics(runs, name, n=1):
    return read_metrics(runs[name, n])[0]


def assert_same_run(runs, a, b, n=1, rtol=1e-6):
    ma, mb = metrics(runs, a, n), metrics(runs, b, n)
    np.testing.assert_array_equal(ma["test_acc"], mb["test_acc"])
    np.testing.assert_allclose(ma["train_loss"], mb["train_loss"], rtol=rtol)
    np.testing.assert_allclose(read_global(runs[a, n]), read_global(runs[b, n]), rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("name", list(CASES))
def test_same_results_at_one_and_three_ranks(runs, name):
    m1, m3 = metrics(runs, name, 1), metrics(runs, name, 3)
    np.testing.assert_array_equal(m1["test_acc"], m3["test_acc"])
    np.testing.assert_array_equal(m1["uploads"], m3["uploads"])
    np.testing.assert_allclose(read_global(runs[name, 1]), read_global(runs[name, 3]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["fsl_gamma0", "fedskip_delta1", "safl_eps1"])
def test_reduces_to_fedavg(runs, name):
    assert_same_run(runs, name, "fedavg")


def test_gated_safl_with_nu_0_uploads_everyone_and_equals_ungated_safl(runs):
    m = metrics(runs, "safl_gated_nu0")
    assert np.all(m["uploads"] == 5)
    assert_same_run(runs, "safl_gated_nu0", "safl")


def test_gated_safl_uploads_fewer_and_counts_only_uploaded_bytes(runs):
    m, attrs = read_metrics(runs["safl_gated", 3])
    assert m["uploads"].sum() < 5 * 6
    np.testing.assert_array_equal(m["bytes_up"], m["uploads"] * 4 * attrs["dim"])
    np.testing.assert_array_equal(m["bytes_down"], np.full(6, 5 * 4 * attrs["dim"]))
    clients = read_clients(runs["safl_gated", 3])
    uploaded, gap, selected = (clients[k] for k in ("uploaded", "gap", "selected"))
    assert np.array_equal(np.nansum(uploaded, axis=1), m["uploads"])
    assert np.all(np.isnan(gap[selected == 0])) and np.all(np.isfinite(gap[selected == 1]))
    np.testing.assert_allclose(m["p_t"], np.exp(-np.arange(6) / 5.0))


def test_fsl_logs_server_loss_and_differs_from_fedavg(runs):
    m = metrics(runs, "fsl")
    assert np.all(np.isfinite(m["server_loss"]))
    assert not np.allclose(read_global(runs["fsl", 1]), read_global(runs["fedavg", 1]))


def test_fedskip_aggregates_and_evaluates_every_delta_rounds(runs):
    m = metrics(runs, "fedskip", 3)
    evaluated = ~np.isnan(m["test_acc"])
    assert evaluated.tolist() == [False, False, True, False, False, True]
    assert np.all(np.isfinite(m["drift"][evaluated])) and np.all(m["drift"][evaluated] > 0)
    assert np.all(np.isnan(m["drift"][~evaluated]))
    assert np.all(m["uploads"] == 5)


def test_datashare_logs_emd_before_and_after_sharing(runs):
    with h5py.File(runs["datashare", 1] / "run.h5", "r") as f:
        before, after = f["partition/emd"][()], f["partition/shared/emd"][()]
        samples_before, samples_after = f["partition/samples"][()], f["partition/shared/samples"][()]
    np.testing.assert_array_equal(samples_after - samples_before, np.full(12, 200))
    assert np.all(after < before)
