"""The training-based personalized algorithms under mpiexec (issue 24): their limits against FedAvg, the same
results at -n 1 and -n 3, and a --resume equal to the uninterrupted run for Ditto and IFCA.

The launches shared with other files (tests/session_runs.py, one per rank count) run every config in
sequence, with local test splits and a local evaluation every round over all clients:
  fedavg        the reference (lr model on mnist5k, 10 clients, Dirichlet 0.5)
  ifca1         IFCA with k = 1: FedAvg bit for bit (global model, metrics, local figures)
  apfl0         APFL with alpha = 0: FedAvg's global model bit for bit
  ditto         Ditto lam 0.1: FedAvg's global model at any lam; whole run, and HALF rounds + --resume
  ditto_pull    lam = 1/eta_l: each personal step restarts from the round's global model (v = w - eta_l g), so
                the personal models stay nearer the global model than those of ditto_free (lam = 0, `local`'s
                training of v); the exact pull onto w is tests/test_pfl_algos.py's hand case
  ifca2         IFCA with k = 2: whole run, and HALF rounds + --resume
  fedavg_iid, qffl0   10 clients of exactly 400 samples: q-FFL with q = 0 averages uniformly, which is
                FedAvg's average there (to float rounding: the arithmetic differs)
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import session_runs
from conftest import read_clients, read_global, read_metrics, small_config, write_config

pytestmark = pytest.mark.mpi

R, HALF = 4, 2
LR = 0.05
LOCAL = {"partition": {"clients": 10, "scheme": "dirichlet", "beta": 0.5, "local_test": 0.2},
         "eval": {"local_every": 1, "local_clients": "all"}}
RUNS = {
    "fedavg": {"name": "fedavg"},
    "ifca1": {"name": "ifca", "k": 1},
    "apfl0": {"name": "apfl", "alpha": 0.0},
    "ditto": {"name": "ditto", "lam": 0.1},
    "ditto_pull": {"name": "ditto", "lam": 1.0 / LR},
    "ditto_free": {"name": "ditto", "lam": 0.0},
    "ifca2": {"name": "ifca", "k": 2},
}
IID = {"fedavg_iid": {"name": "fedavg"}, "qffl0": {"name": "qffl", "q": 0.0}}
RESUMED = ("ditto", "ifca2")


def config_of(name, out):
    if name in IID:
        return small_config(out, rounds=R, algorithm=IID[name], server={"clients_per_round": 4},
                            partition={"clients": 10, "scheme": "iid"}, client={"lr": LR, "batch_size": 20,
                                                                                 "epochs": 1, "vectorize": "off"})
    return small_config(out, rounds=R, algorithm=RUNS[name], checkpoint={"every": 1, "keep": 10},
                        client={"lr": LR, "batch_size": 20, "epochs": 1, "vectorize": "off"}, **LOCAL)


@session_runs.per_n
def launch(base, n):
    steps, out = [], {}
    for name in [*RUNS, *IID]:
        out[name] = base / name
        cfg = write_config(base / f"{name}.yaml", config_of(name, out[name]))
        steps.append([cfg])
        if name in RESUMED:
            out[f"{name}-resumed"] = half = base / f"{name}-resumed"
            steps += [[cfg, f"out={half}", f"rounds={HALF}"], [cfg, f"out={half}", "--resume", f"rounds={R}"]]
    return steps, out


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, launch)      # tests/session_runs.py: in the launches shared with other files


def metrics(run_dir):
    got, attrs = read_metrics(run_dir)
    assert attrs["status"] == "finished"
    return {k: v for k, v in got.items() if k != "wall_s"}


def assert_same_metrics(a, b, keys=None):
    keys = sorted(set(a) & set(b)) if keys is None else keys
    for key in keys:
        assert np.array_equal(a[key], b[key], equal_nan=a[key].dtype.kind == "f"), key


def assert_same_train_loss(a, b):
    """The training loss of runs whose clients train on other ranks (FedAvg deals its clients to the workers
    each round, algorithms with client state train them on their hosts): the same clients' loss sums, added
    in float64 in another order and grouping, which gives the same sum."""
    assert np.array_equal(a["train_loss"], b["train_loss"])


def client_states(run_dir, round_):
    """{path: array} of the checkpoint after round `round_`: the global model and every client's vectors."""
    found = {}
    with h5py.File(Path(run_dir) / "ckpt" / f"ckpt-{round_}.h5", "r", locking=False) as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset)
                     and (name == "global" or name.startswith("clients/")) else None)
    return found


@pytest.mark.parametrize("n", [1, 3])
def test_ifca_k1_is_fedavg(runs, n):
    fedavg, ifca = metrics(runs[n]["fedavg"]), metrics(runs[n]["ifca1"])
    assert np.array_equal(read_global(runs[n]["ifca1"]), read_global(runs[n]["fedavg"]))
    assert_same_metrics(ifca, fedavg, ["test_acc", "test_loss", "local_acc_mean", "local_acc_worst10"])
    assert_same_train_loss(ifca, fedavg)
    assert np.all(read_clients(runs[n]["ifca1"])["cluster"][np.isfinite(read_clients(runs[n]["ifca1"])["cluster"])]
                  == 0)


@pytest.mark.parametrize("n", [1, 3])
def test_apfl_alpha0_and_ditto_keep_fedavgs_global_model(runs, n):
    fedavg = metrics(runs[n]["fedavg"])
    for name in ("apfl0", "ditto", "ditto_pull", "ditto_free"):
        assert np.array_equal(read_global(runs[n][name]), read_global(runs[n]["fedavg"])), name
        assert_same_metrics(metrics(runs[n][name]), fedavg, ["test_acc", "test_loss"])
        assert_same_train_loss(metrics(runs[n][name]), fedavg)


@pytest.mark.parametrize("n", [1, 3])
def test_ditto_large_lam_keeps_personal_models_near_the_global_model(runs, n):
    """lam = 1/eta_l: every personal step restarts from the round's w (v = w - eta_l g), so v stays one step
    from the global model; lam = 0 trains v freely (as `local`), further away."""
    def distances(name):
        states = client_states(runs[n][name], R)
        w = states["global"]
        return np.array([np.linalg.norm(v - w) for k, v in states.items() if k.endswith("/v")])

    pull, free = distances("ditto_pull"), distances("ditto_free")
    assert len(pull) == len(free) >= 5
    assert pull.mean() < free.mean(), (pull.mean(), free.mean())


@pytest.mark.parametrize("n", [1, 3])
def test_qffl_q0_is_fedavg_on_equal_clients(runs, n):
    assert np.all(read_metrics(runs[n]["fedavg_iid"])[0]["uploads"] == 4)
    np.testing.assert_allclose(read_global(runs[n]["qffl0"]), read_global(runs[n]["fedavg_iid"]), rtol=1e-4,
                               atol=1e-6)
    assert not np.array_equal(read_global(runs[n]["qffl0"]), read_global(runs[n]["fedavg"]))


@pytest.mark.parametrize("name", RESUMED)
@pytest.mark.parametrize("n", [1, 3])
def test_resume_equals_the_whole_run(runs, n, name):
    whole, resumed = runs[n][name], runs[n][f"{name}-resumed"]
    assert_same_metrics(metrics(resumed), metrics(whole))
    assert np.array_equal(read_global(resumed), read_global(whole))
    a, b = client_states(resumed, R), client_states(whole, R)
    assert sorted(a) == sorted(b) and any(k.startswith("clients/") for k in a)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    ca, cb = read_clients(resumed), read_clients(whole)
    for key in ("cluster", "local_acc") if name == "ifca2" else ("local_acc",):
        assert np.array_equal(ca[key], cb[key], equal_nan=True), key


@pytest.mark.parametrize("name", ["ditto", "ifca2", "apfl0"])
def test_same_results_at_n1_and_n3(runs, name):
    one, three = runs[1][name], runs[3][name]
    assert np.array_equal(read_global(one), read_global(three))
    got, want = metrics(one), metrics(three)
    assert_same_metrics(got, want, sorted(set(got) - {"train_loss"}))
    assert_same_train_loss(got, want)   # summed per rank: the same losses in another order and grouping
    a, b = client_states(one, R), client_states(three, R)
    assert sorted(a) == sorted(b)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    if name == "ifca2":
        assert np.array_equal(read_clients(one)["cluster"], read_clients(three)["cluster"], equal_nan=True)
        assert metrics(one)["cluster_share"].shape == (R, 2)
