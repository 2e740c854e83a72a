"""Secure aggregation under MPI (issue 26): one launch per -n (1 and 3) runs every case below in sequence
(tests/session_runs.py, shared with other files), each also stopped halfway and continued with --resume:
  secagg     SecAgg with 30% dropout after the set-up: masks of dropped clients removed through Shamir
  plus       SecAgg+ (4-regular graph) with shared-seed rand-k, error feedback and Skellam distributed DP
  failing    a threshold the survivors often miss: failed rounds keep the model, the run goes on
The decoded sums are exact integers, so the models must be bit-identical at -n 1 and -n 3, and a resumed run
bit-identical to the uninterrupted one."""

import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, same, small_config, write_config

R, HALF = 4, 2
RUNS = {
    "secagg": {"server": {"clients_per_round": 6, "secure_aggregation": "secagg"},
               "clients": {"dropout": 0.3}, "secagg": {"bits": 32, "clip": 2.0, "scale": 100000.0}},
    "plus": {"server": {"clients_per_round": 6, "secure_aggregation": "secagg_plus"},
             "clients": {"dropout": 0.2},
             "client": {"lr": 0.05, "batch_size": 20, "epochs": 1,
                        "compress": {"name": "randk", "fraction": 0.25, "error_feedback": True}},
             "secagg": {"bits": 40, "clip": 2.0, "scale": 100000.0, "neighbours": 4, "threshold": 3,
                        "noise": "skellam", "noise_multiplier": 0.5, "delta": 0.01}},
    "failing": {"server": {"clients_per_round": 6, "secure_aggregation": "secagg"},
                "clients": {"dropout": 0.4}, "secagg": {"bits": 32, "threshold": 4}},
}

@session_runs.per_n
def launch(base, n):
    steps, out = [], {}
    for name, sections in RUNS.items():
        cfg = write_config(base / f"{name}.yaml", small_config(base / name, rounds=R,
                                                               checkpoint={"every": 1, "keep": 10}, **sections))
        out[name], out[f"{name}-resumed"] = base / name, base / f"{name}-resumed"
        steps += [[cfg], [cfg, f"out={out[name]}-resumed", f"rounds={HALF}"],
                  [cfg, f"out={out[name]}-resumed", "--resume", f"rounds={R}"]]
    return steps, out


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, launch)      # tests/session_runs.py: in the launches shared with other files


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(RUNS))
def test_same_model_at_n1_and_n3_and_after_a_resume(runs, name):
    one, three = runs[1], runs[3]
    m1, _ = read_metrics(one[name])
    m3, _ = read_metrics(three[name])
    assert np.array_equal(read_global(one[name]), read_global(three[name]))
    assert same(m1["model_sha256"], m3["model_sha256"]) and same(m1["test_acc"], m3["test_acc"])
    for n, out in ((1, one), (3, three)):
        whole, resumed = read_metrics(out[name])[0], read_metrics(out[f"{name}-resumed"])[0]
        assert np.array_equal(read_global(out[name]), read_global(out[f"{name}-resumed"])), n
        for key in ("model_sha256", "secagg_survivors", "secagg_failed", "secagg_messages", "bytes_up"):
            assert same(whole[key], resumed[key]), (n, key)


@pytest.mark.mpi
def test_dropouts_are_recovered_and_failed_rounds_keep_the_model(runs):
    out = runs[3]
    m, attrs = read_metrics(out["secagg"])
    assert (m["secagg_dropped"] > 0).any() and not m["secagg_failed"].any()     # dropouts, all recovered
    assert m["test_acc"][-1] > 0.5
    # bytes: the masked vector at 32 bits (7850 entries) plus the protocol's own, per surviving upload.
    assert (m["bytes_up"] >= m["uploads"] * np.ceil(7850 * 32 / 8)).all()
    assert attrs["secagg_threshold"] == 4 and attrs["secagg_mode"] == "secagg"
    f, _ = read_metrics(out["failing"])
    failed = f["secagg_failed"] == 1
    assert failed.any() and (~failed).any(), f["secagg_survivors"]
    assert (f["secagg_survivors"][failed] < 4).all() and (f["secagg_survivors"][~failed] >= 4).all()
    sha = f["model_sha256"]
    for t in np.flatnonzero(failed):
        assert t > 0 and sha[t] == sha[t - 1] or t == 0     # the model did not move
    p, attrs = read_metrics(out["plus"])
    assert (p["secagg_client_prg"] == 5).all()                      # 4 neighbours + the self mask
    # rand-k keeps floor(0.25 * 7850 + 1/2) = 1963 coordinates, the same for every client of a round
    assert (p["secagg_masked_bytes"] == np.ceil(1963 * 40 / 8)).all()
    assert np.isfinite(p["epsilon"]).all() and (np.diff(p["epsilon"]) > 0).all()
    assert (p["secagg_noise_multiplier"] <= 0.5).all()
