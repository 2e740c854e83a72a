"""Robust aggregation under MPI (issue 25, part 1): the launches at -n 1 and -n 3 shared with other files
(tests/session_runs.py) run median and Krum whole and stopped halfway then resumed, and every omniscient attack
against a robust rule; the runs must be bit-identical across -n, and a resumed run identical to the
uninterrupted one."""

import h5py
import numpy as np
import pytest
import session_runs
from conftest import small_config, write_config

R, HALF = 4, 2
MEMORY = {"threads": 1, "progress": "off", "gather_memory": 1}      # one 4096-coordinate block per chunk
RUNS = {
    "median": ({"aggregator": "median"}, {}),
    "krum": ({"aggregator": "krum", "robust": {"f": 1}}, {"name": "alie", "fraction": 0.25}),
    "ipm_mean": ({}, {"name": "ipm", "fraction": 0.25, "epsilon": 0.5}),
    "min_max_trimmed": ({"aggregator": "trimmed_mean", "robust": {"beta": 0.2}}, {"name": "min_max", "fraction": 0.25}),
    "min_sum_bulyan": ({"aggregator": "bulyan", "clients_per_round": 7, "robust": {"f": 1}},
                       {"name": "min_sum", "fraction": 0.25, "perturbation": "unit"}),
    "fltrust": ({"aggregator": "fltrust"}, {"name": "ipm", "fraction": 0.25}),
}
RESUMED = ("median", "krum")


def config_of(name, out):
    server, attack = RUNS[name]
    extra = {"server_data": {"size": 100}} if name == "fltrust" else {}
    return small_config(out, rounds=R, server={"clients_per_round": 6, **server}, attack=attack or {"name": "none"},
                        runtime=MEMORY, checkpoint={"every": 2, "keep": 2}, **extra)


@session_runs.per_n
def launch(base, n):
    steps, runs = [], {}
    for name in RUNS:
        path = write_config(base / f"{name}.yaml", config_of(name, base / name))
        runs[name] = base / name
        steps.append([path, "--overwrite"])
        if name in RESUMED:
            half = runs[f"{name}-resumed"] = base / f"{name}-resumed"
            steps += [[path, f"out={half}", f"rounds={HALF}", "--overwrite"],
                      [path, f"out={half}", "--resume", f"rounds={R}"]]
    return steps, runs


def read(run):
    with h5py.File(run / "run.h5", "r", locking=False) as f:
        return ({k: f[f"metrics/{k}"][()] for k in f["metrics"]},
                {k: f[f"clients/{k}"][()] for k in f["clients"]}, f["model/global"][()])


@pytest.fixture(scope="module")
def runs(request):
    launched = session_runs.result(request, launch)  # tests/session_runs.py: in the launches shared with other files
    return {n: {name: read(path) for name, path in launched[n].items()} for n in (1, 3)}


@pytest.mark.mpi
@pytest.mark.parametrize("name", [*RUNS, *(f"{r}-resumed" for r in RESUMED)])
def test_identical_at_n1_and_n3(runs, name):
    (m1, c1, x1), (m3, c3, x3) = runs[1][name], runs[3][name]
    assert len(m1["round"]) == R and np.array_equal(x1, x3)
    assert list(m1["model_sha256"]) == list(m3["model_sha256"])
    assert np.array_equal(c1["robust_weight"], c3["robust_weight"], equal_nan=True)
    for key in ("detect_precision", "detect_recall", "honest_excluded"):
        if key in m1:
            assert np.array_equal(m1[key], m3[key], equal_nan=True)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", RESUMED)
def test_resume_equals_no_interruption(runs, n, name):
    (mw, cw, xw), (mr, cr, xr) = runs[n][name], runs[n][f"{name}-resumed"]
    assert np.array_equal(xw, xr) and list(mw["model_sha256"]) == list(mr["model_sha256"])
    assert np.array_equal(cw["robust_weight"], cr["robust_weight"], equal_nan=True)


@pytest.mark.mpi
def test_the_attacks_and_the_rules_changed_the_model(runs):
    """Each attacked run differs from the others (the attack reached the aggregate); Krum flags clients."""
    models = {name: runs[3][name][2] for name in RUNS}
    assert len({m.tobytes() for m in models.values()}) == len(models)
    metrics, clients, _ = runs[3]["krum"]
    assert ((clients["robust_weight"] == 1).sum(axis=1) == 1).all()      # Krum keeps exactly one client
    assert np.all((metrics["honest_excluded"] >= 0) & (metrics["honest_excluded"] <= 1))
