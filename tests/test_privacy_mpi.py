"""Client-level DP in the round loop under mpiexec (issue 16, phase 2; docs/how-to/privacy.md): the same model at -n 1
and -n 3, and a resumed DP run equal to an uninterrupted one. Split from tests/test_privacy_run.py by topic: that
file has the one-process checks (the config's hash, clipping and noise against hand computations, epsilon, the
algorithms that run under DP, the report tool)."""

from __future__ import annotations

import copy

import h5py
import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, same, small_config, write_config
from test_privacy_run import DELTA, direct_epsilons

from fedmpi import config
from fedmpi.privacy import accounting
from fedmpi.privacy.accounting import Sampling
from fedmpi.round.wire import DEVICE_MPI_TEST

# --- under mpiexec: -n invariance and resume -------------------------------------------------------

R, HALF = 8, 4
DP_CASES = {
    # Poisson sampling with adaptive clipping: C crosses the broadcast and the checkpoint
    "adaptive": {"server": {"clients_per_round": 4, "sampling": "poisson"},
                 "privacy": {"mechanism": "gaussian", "clip": 0.3, "noise_multiplier": 0.6, "delta": DELTA,
                             "adaptive_clip": True, "clip_count_stddev": 1.0}},
    # fixed-size sampling, FSL with its server learning on D0, a server optimizer with state
    "fsl": {"server": {"clients_per_round": 4, "optimizer": "avgm", "lr": 0.5}, "algorithm": {"name": "fsl"},
            "server_data": {"size": 300},
            "privacy": {"mechanism": "gaussian", "clip": 0.3, "noise_multiplier": 0.6, "delta": DELTA}},
}
TARGET = {"server": {"clients_per_round": 4, "sampling": "poisson"},
          "privacy": {"mechanism": "gaussian", "clip": 0.3, "target_epsilon": 6.0, "delta": DELTA}}


def mpi_config(base, name, **sections):
    cfg = small_config(base / name, rounds=R, checkpoint={"every": 2, "keep": 10},
                       client={"lr": 0.05, "batch_size": 20, "epochs": 1, "vectorize": "off"}, **sections)
    return write_config(base / f"{name}.yaml", cfg)


@session_runs.plan
def privacy_runs(base):
    """The same configs at -n 1 and at -n 3, where the same launch then runs the DP runs' first halves and
    their --resume, and a target_epsilon run resumed with more rounds (tests/session_runs.py: in the
    launches shared with other files)."""
    runs, batched = {}, {}
    for n in (1, 3):
        d = base / f"n{n}"
        d.mkdir()
        paths = [mpi_config(d, "plain"),
                 mpi_config(d, "off", privacy={"mechanism": "none", "clip": 0.01, "adaptive_clip": True})]
        paths += [mpi_config(d, name, **copy.deepcopy(sections)) for name, sections in DP_CASES.items()]
        # the adaptive case again with the broadcast and reduction through the device buffers (on the CPU)
        paths.append(mpi_config(d, "device_mpi", **copy.deepcopy(DP_CASES["adaptive"]),
                                runtime={"threads": 1, "progress": "lines", "cuda_aware_mpi": True}))
        batched[n] = paths
        runs[n] = d
    d = base / "resume"
    d.mkdir()
    steps = []
    for name, sections in DP_CASES.items():
        cfg = mpi_config(d, name, **copy.deepcopy(sections))
        steps += [[cfg, f"rounds={HALF}"], [cfg, "--resume"]]
    target = mpi_config(d, "target", **copy.deepcopy(TARGET))
    steps += [[target, f"rounds={HALF}"], [target, "--resume", f"rounds={R}"]]
    runs["resume"] = d
    # The device-buffer test aid (set for the batched runs) acts only on the run with runtime.cuda_aware_mpi.
    device = {DEVICE_MPI_TEST: "1"}
    launches = {n: [[device, "run", path, "--overwrite"] for path in batched[n]] for n in (1, 3)}
    launches[3] += [["run", *step] for step in steps]
    return launches, runs


@pytest.fixture(scope="module")
def mpi_runs(request):
    return session_runs.result(request, privacy_runs)


def same_metrics(a, b):
    """Every figure equal (wall_s aside), across -n too: train_loss is summed in float64, whose sums of the
    clients' float32 loss sums do not depend on their order or grouping."""
    assert sorted(a) == sorted(b)
    for name in a:
        if name != "wall_s":
            assert same(a[name], b[name]), name


@pytest.mark.mpi
def test_mpi_mechanism_off_is_bit_identical_at_each_n(mpi_runs):
    for n in (1, 3):
        d = mpi_runs[n]
        (plain, plain_attrs), (off, off_attrs) = read_metrics(d / "plain"), read_metrics(d / "off")
        same_metrics(plain, off)
        assert np.array_equal(read_global(d / "plain"), read_global(d / "off"))
        assert plain_attrs["config_hash"] == off_attrs["config_hash"]
        assert "privacy_noise_multiplier" not in off_attrs


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(DP_CASES))
def test_mpi_dp_runs_do_not_depend_on_n(mpi_runs, name):
    (m1, a1), (m3, a3) = read_metrics(mpi_runs[1] / name), read_metrics(mpi_runs[3] / name)
    same_metrics(m1, m3)
    assert np.array_equal(read_global(mpi_runs[1] / name), read_global(mpi_runs[3] / name))
    assert a1["privacy_noise_multiplier"] == a3["privacy_noise_multiplier"] == 0.6
    cfg = config.load(mpi_runs[3] / f"{name}.yaml")
    sampling = Sampling(cfg.server.sampling, cfg.partition.clients, cfg.server.clients_per_round)
    np.testing.assert_array_equal(m3["epsilon"], direct_epsilons(R, sampling, 0.6, DELTA))
    if name == "adaptive":
        assert len(set(m3["dp_clip"].tolist())) == R       # C moved every round, the same at both n


@pytest.mark.mpi
def test_mpi_header_through_device_buffers_is_the_same(mpi_runs):
    for n in (1, 3):
        d = mpi_runs[n]
        same_metrics(read_metrics(d / "adaptive")[0], read_metrics(d / "device_mpi")[0])
        assert np.array_equal(read_global(d / "adaptive"), read_global(d / "device_mpi"))


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(DP_CASES))
def test_mpi_dp_resume_is_bit_identical(mpi_runs, name):
    ref, resumed = mpi_runs[3] / name, mpi_runs["resume"] / name
    (m_ref, _), (m_res, attrs) = read_metrics(ref), read_metrics(resumed)
    assert f"from round {HALF} at world_size 3" in attrs["resumes"]
    same_metrics(m_ref, m_res)
    assert np.array_equal(read_global(ref), read_global(resumed))
    with h5py.File(resumed / "ckpt" / f"ckpt-{HALF}.h5", "r") as f:
        assert f["stage_privacy/noise_multiplier"][()].tolist() == [0.6]
        if name == "adaptive":       # the clip of round HALF, which the resumed run broadcast first
            assert float(np.float32(f["stage_privacy/clip"][0])) == m_ref["dp_clip"][HALF]


@pytest.mark.mpi
def test_mpi_resume_keeps_the_calibrated_noise_when_rounds_grow(mpi_runs):
    d = mpi_runs["resume"] / "target"
    metrics, attrs = read_metrics(d)
    sampling = Sampling("poisson", 12, 4)
    z_half = accounting.noise_for_epsilon(6.0, HALF, DELTA, sampling)
    assert attrs["privacy_noise_multiplier"] == z_half        # not the calibration for R rounds
    assert z_half != accounting.noise_for_epsilon(6.0, R, DELTA, sampling)
    np.testing.assert_array_equal(metrics["epsilon"], direct_epsilons(R, sampling, z_half, DELTA))
    assert metrics["epsilon"][HALF - 1] <= 6.0 < metrics["epsilon"][-1]    # the budget is spent past HALF
    assert attrs["privacy_epsilon"] == metrics["epsilon"][-1]
