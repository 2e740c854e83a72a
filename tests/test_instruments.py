"""The research instruments of issue 12, written by the run itself: per-class accuracy, drift diagnostics,
weight divergence against centralized SGD, model fingerprints, and the per-rank time breakdown.

In process through `fedmpi.simulate` (the same round loop as `fedmpi run` at -n 1), against hand computations
on tiny cases; the MPI cases check that the figures do not depend on the number of ranks.
"""

import hashlib
import subprocess
import sys

import numpy as np
import pytest
import session_runs
import torch
from conftest import ROOT, read_clients, read_metrics, small_config, write_config
from torch import nn

import fedmpi
from fedmpi.core.timing import PHASES
from fedmpi.data.dataset import Dataset


def mnist5k(**sections):
    cfg = {"seed": 2, "rounds": 3, "data": {"name": "mnist5k"},
           "partition": {"clients": 10, "scheme": "iid"}, "model": {"name": "lr"},
           "client": {"lr": 0.05, "batch_size": 20}, "server": {"clients_per_round": 5},
           "runtime": {"threads": 1, "progress": "off"}}
    cfg.update(sections)
    return cfg


# -- per-class accuracy ----------------------------------------------------------------------------------

def test_class_accuracies_average_to_the_test_accuracy_with_the_class_weights():
    result = fedmpi.simulate(mnist5k())
    counts = result.experiment.evaluation.class_counts
    acc, class_acc = result.metrics["test_acc"], result.metrics["class_acc"]
    assert class_acc.shape == (3, 10) and counts.sum() == len(result.experiment.dataset.y_test)
    np.testing.assert_allclose(class_acc @ counts / counts.sum(), acc, rtol=1e-12)
    assert ((class_acc >= 0) & (class_acc <= 1)).all()


# -- drift diagnostics on a case worked out by hand -------------------------------------------------------

X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [2.0, -1.0], [-1.0, 1.0], [0.5, 0.5]], dtype=np.float32)
Y = np.array([1.0, -1.0, 2.0, 0.0, 1.0, 3.0], dtype=np.float32)
PARTS = [np.array([0]), np.array([1, 2]), np.array([3, 4, 5])]
W0 = np.array([0.5, -0.25])


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(W0, dtype=torch.float32))

    def forward(self, x):
        return x @ self.w


def half_mse(out, y):
    return 0.5 * ((out - y) ** 2).mean()


def test_drift_scalars_and_cosines_equal_a_hand_computation():
    # One full-batch step per client from w0: Delta_i = -lr * X_i^T (X_i w0 - y_i) / n_i, weights p_i = n_i / 6.
    data = Dataset("toy", X, Y, X, Y, 1)
    cfg = {"seed": 0, "rounds": 1, "partition": {"clients": 3}, "server": {"clients_per_round": 3},
           "client": {"lr": 0.1, "batch_size": 3, "steps": 1}, "eval": {"client_drift": True},
           "runtime": {"threads": 1, "progress": "off"}}
    result = fedmpi.simulate(cfg, dataset=data, model=Linear(), parts=PARTS, loss=half_mse)
    deltas = [-0.1 * X[p].T.astype(np.float64) @ (X[p] @ W0 - Y[p]) / len(p) for p in PARTS]
    p = np.array([1, 2, 3]) / 6
    aggregate = sum(pi * d for pi, d in zip(p, deltas))
    update_sq = sum(pi * d @ d for pi, d in zip(p, deltas))
    m = result.metrics
    assert m["update_sq_norm"][0] == pytest.approx(update_sq, rel=1e-6)
    assert m["aggregate_sq_norm"][0] == pytest.approx(aggregate @ aggregate, rel=1e-6)
    assert m["gradient_diversity"][0] == pytest.approx(update_sq / (aggregate @ aggregate), rel=1e-6)
    norms = [np.linalg.norm(d) for d in deltas]
    cosines = [d @ aggregate / (np.linalg.norm(d) * np.linalg.norm(aggregate)) for d in deltas]
    np.testing.assert_allclose(result.clients["update_norm"][0], norms, rtol=1e-6)
    np.testing.assert_allclose(result.clients["update_cosine"][0], cosines, rtol=1e-5)
    np.testing.assert_allclose(result.model, W0 + aggregate, rtol=1e-6)


def test_drift_sum_over_clients_is_the_same_bits_in_every_grouping_and_order():
    # The -n promise at its smallest: update_sq is summed per rank in float64, then reduced over ranks; the
    # terms (float32 norms times sample counts) must add exactly, whatever the ranks and their client order.
    from types import SimpleNamespace

    from fedmpi.round.observers import ClientDrift

    rng = np.random.default_rng(7)
    drift = ClientDrift(num_clients=24, keep_updates=False)
    updates = [SimpleNamespace(cid=c, start=torch.from_numpy(rng.standard_normal(300, dtype=np.float32)),
                               vector=torch.from_numpy(rng.standard_normal(300, dtype=np.float32)
                                                       * np.float32(10.0 ** rng.integers(-3, 3))))
               for c in range(24)]
    weights = rng.integers(1, 5000, 24).astype(float)

    def summed(groups):
        total = 0.0
        for group in groups:
            tally = SimpleNamespace(update_sq=0.0)
            for c in group:
                drift.measure(updates[c], weights[c], tally)
            total += tally.update_sq
        return total

    one = summed([range(24)])
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(24)
        assert summed(np.array_split(order, 1 + seed % 4)) == one


# -- weight divergence ------------------------------------------------------------------------------------

def test_divergence_is_zero_when_the_federation_is_centralized_sgd():
    # One client holds all the data and trains full-batch: exactly what the shadow does (batch B = n).
    data = Dataset("toy", X, Y, X, Y, 1)
    cfg = {"seed": 0, "rounds": 4, "partition": {"clients": 1}, "server": {"clients_per_round": 1},
           "client": {"lr": 0.1, "batch_size": 6, "epochs": 2}, "eval": {"divergence": True},
           "runtime": {"threads": 1, "progress": "off"}}
    result = fedmpi.simulate(cfg, dataset=data, model=Linear(), parts=[np.arange(6)], loss=half_mse)
    div = result.metrics["weight_divergence"]
    assert div.shape == (4,) and np.all(div < 1e-6), div
    assert result.metrics["weight_divergence_layers"].shape == (4, 1)
    assert result.experiment.metric_attrs["weight_divergence_layers"] == {"layers": ["w"]}


def test_divergence_of_fedavg_grows_with_label_skew():
    """Zhao et al.'s observation: FedAvg drifts further from centralized SGD on a 1-class split than on
    an IID one, and further as the rounds go on."""
    common = dict(rounds=12, model={"name": "lr"}, eval={"every": 4, "divergence": True},
                  client={"lr": 0.05, "batch_size": 10}, server={"clients_per_round": 10})
    iid = fedmpi.simulate(mnist5k(partition={"clients": 20, "scheme": "iid"}, **common))
    skew = fedmpi.simulate(mnist5k(partition={"clients": 20, "scheme": "shards", "shards_per_client": 1}, **common))
    d_iid, d_skew = iid.metrics["weight_divergence"], skew.metrics["weight_divergence"]
    assert np.all(d_skew > d_iid), (d_skew, d_iid)
    assert d_skew[-1] > d_skew[len(d_skew) // 2] > d_skew[0]
    assert np.isfinite(skew.metrics["shadow_acc"][3::4]).all()


# -- fingerprint and timing -------------------------------------------------------------------------------

def test_fingerprint_is_the_sha256_of_the_float32_model():
    result = fedmpi.simulate(mnist5k(rounds=2))
    fp = result.metrics["model_sha256"]
    assert fp.shape == (2,) and fp[0] != fp[1]
    assert fp[-1] == hashlib.sha256(result.model.astype("<f4").tobytes()).hexdigest()


def test_timing_covers_every_phase_of_every_round():
    result = fedmpi.simulate(mnist5k(rounds=3))
    timing = result.timing
    assert timing.shape == (3, 1, len(PHASES)) and np.all(timing >= 0)
    train, evaluate = timing[:, 0, PHASES.index("train")], timing[:, 0, PHASES.index("eval")]
    assert np.all(train > 0) and np.all(evaluate > 0)
    # A round's phases add up to at most its wall time (the log row itself is charged to the next round).
    assert np.all(timing[:, 0].sum(axis=1) <= np.diff(np.concatenate([[0], result.metrics["wall_s"]])) + 0.05)


# -- the same figures at every -n, and rank 0 hosting clients --------------------------------------------

@session_runs.plan
def instrumented_runs(base):
    """The instrumented config at -n 1, 2 (rank 0 training clients, or not) and 3 (tests/session_runs.py:
    in the launches shared with other files)."""
    sections = dict(rounds=3, eval={"divergence": True, "client_drift": True})
    runs, steps = {}, {1: [], 2: [], 3: []}
    for key, n, trains in [("n1", 1, None), ("n2_host", 2, True), ("n2_server", 2, False), ("n3", 3, None)]:
        out = base / key
        cfg = small_config(out, server={"clients_per_round": 5, "trains_clients": trains}, **sections)
        runs[key] = (n, write_config(base / f"{key}.yaml", cfg), out)
        steps[n].append(["run", runs[key][1], "--overwrite"])
    return steps, runs


@pytest.fixture(scope="module")
def instrumented(request):
    return session_runs.result(request, instrumented_runs)


@pytest.mark.mpi
def test_instruments_and_rank0_hosting_do_not_depend_on_the_ranks(instrumented):
    runs = instrumented
    ref, _ = read_metrics(runs["n1"][2])
    for key in ("n2_host", "n2_server", "n3"):
        got, attrs = read_metrics(runs[key][2])
        np.testing.assert_array_equal(got["test_acc"], ref["test_acc"], err_msg=key)
        np.testing.assert_array_equal(got["test_loss"], ref["test_loss"], err_msg=key)
        np.testing.assert_array_equal(got["class_acc"], ref["class_acc"], err_msg=key)
        for name in ("update_sq_norm", "aggregate_sq_norm", "weight_divergence", "shadow_acc"):
            np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, err_msg=f"{key} {name}")
    import h5py

    with h5py.File(runs["n3"][2] / "run.h5", "r") as f:
        assert set(f["timing"]) == set(PHASES) and f["timing/train"].shape == (3, 3)
        train = f["timing/train"][()]
        assert np.all(train[:, 1:] > 0) and np.all(train[:, 0] > 0)   # workers train; rank 0 the shadow
    clients = read_clients(runs["n3"][2])
    cosines, selected = clients["update_cosine"], clients["selected"] == 1
    assert np.isfinite(cosines[selected]).all() and np.isnan(cosines[~selected]).all()
    with h5py.File(runs["n2_host"][2] / "run.h5", "r") as f:
        assert f["timing/train"].shape == (3, 2) and np.all(f["timing/train"][()] > 0)   # rank 0 trains too
    # `fedmpi verify` across process counts: it says so and judges the differences against the tolerance.
    proc = subprocess.run([sys.executable, "-m", "fedmpi", "verify", str(runs["n1"][2]), str(runs["n3"][2])],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "world_size" in proc.stdout and "1e-05" in proc.stdout, proc.stdout
