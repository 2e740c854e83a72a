"""The reference-code options of issue 13 under mpiexec: the same results at -n 1 and -n 3, and a --resume
that continues bit-identically (the new per-client state: SAFL's pending z_k and mixed w_k, SCAFFOLD's
controls stored relative to c0, MOON's previous models).

One -n 3 launch runs every config whole, then its first half and the --resume of it (through
`fedmpi.cli.main`, as tests/test_resume.py does); one -n 1 launch runs every config whole. Both launches
are shared with other files (tests/session_runs.py).
"""

import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, small_config, write_config

pytestmark = pytest.mark.mpi

R, HALF = 6, 3
CASES = {
    # Partial participation (5 of 12): the mixing times differ; z_k is pending across the checkpoint.
    "safl_end_of_round": {"algorithm": {"name": "safl", "L": 4.0, "eps": 0.5, "mix": "end_of_round"}},
    "safl_gated_end_of_round": {"algorithm": {"name": "safl", "L": 4.0, "eps": 0.5, "mix": "end_of_round",
                                              "gating": True, "nu": 2.0}},
    "scaffold_reference": {"algorithm": {"name": "scaffold", "correction": "after_step",
                                         "initial_controls": "model_init"},
                           "client": {"lr": 0.05, "batch_size": 20, "epochs": 1, "momentum": 0.9}},
    "moon_model_init": {"algorithm": {"name": "moon", "first_round": "model_init", "mu": 1.0},
                        "model": {"name": "simple_cnn", "projection": 16}},
    "fedavg_drop_last": {"client": {"lr": 0.05, "batch_size": 64, "epochs": 1, "drop_last": True}},
    "datashare_zhao": {"algorithm": {"name": "datashare", "alpha": 0.5, "warmup_epochs": 20,
                                     "warmup_target_acc": 0.6},
                       "server_data": {"fraction": 0.1, "holdout": 500, "scheme": "classes", "source": "holdout"}},
}

@session_runs.plan
def fidelity_runs(base):
    """At -n 3 every case, its first half and the --resume; at -n 1 every case (tests/session_runs.py: in
    the launches shared with other files)."""
    steps = {1: [], 3: []}
    for name, sections in CASES.items():
        cfg = small_config(base / name / "n3", **{"rounds": R, **sections, "checkpoint": {"every": 1, "keep": 2}})
        path = write_config(base / f"{name}.yaml", cfg)
        steps[3] += [["run", path],
                     ["run", path, f"rounds={HALF}", f"out={base / name / 'half'}"],
                     ["run", path, "--resume", f"out={base / name / 'half'}"]]
        cfg = small_config(base / name / "n1", **{"rounds": R, **CASES[name]})
        steps[1].append(["run", write_config(base / f"{name}-n1.yaml", cfg), "--overwrite"])
    return steps, base


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, fidelity_runs)


@pytest.mark.parametrize("name", list(CASES))
def test_same_results_at_one_and_three_ranks(runs, name):
    m1, _ = read_metrics(runs / name / "n1")
    m3, attrs = read_metrics(runs / name / "n3")
    assert attrs["status"] == "finished" and len(m3["round"]) == R
    np.testing.assert_array_equal(m1["test_acc"], m3["test_acc"])
    np.testing.assert_allclose(read_global(runs / name / "n1"), read_global(runs / name / "n3"), rtol=1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("name", list(CASES))
def test_resume_is_bit_identical(runs, name):
    ref, _ = read_metrics(runs / name / "n3")
    got, attrs = read_metrics(runs / name / "half")
    assert attrs["status"] == "finished" and f"from round {HALF}" in attrs["resumes"]
    for key in ref:
        if key != "wall_s":
            np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
    assert np.array_equal(read_global(runs / name / "half"), read_global(runs / name / "n3"))


def test_warmup_target_is_logged_at_round_0(runs):
    """The warm-up to a target accuracy runs in the MPI path too and logs where it stopped, once."""
    m, _ = read_metrics(runs / "datashare_zhao" / "n3")
    assert m["warmup_acc"][0] >= 0.6 and 1 <= m["warmup_epochs"][0] <= 20
    assert np.isnan(m["warmup_epochs"][1:]).all()
