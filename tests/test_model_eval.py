"""The run evaluator (fedmpi.analysis.model_eval) against what tiny finished runs recorded."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import small_config, write_config

from fedmpi.analysis.model_eval import RunEvaluator, checkpoint_rounds, final_vector, vector_at
from fedmpi.cli import main
from fedmpi.core.errors import InputError
from fedmpi.core.fingerprint import fingerprint

ROUNDS = 3


def finished_run(folder, **sections):
    """A finished run of mnist5k over 6 clients, a checkpoint after every round, and its recorded figures."""
    out = folder / "run"
    keys = {"rounds": ROUNDS, "partition": {"clients": 6, "scheme": "dirichlet", "beta": 0.5},
            "server": {"clients_per_round": 3}, "checkpoint": {"every": 1, "keep": 10}}
    cfg = small_config(str(out), **{**keys, **sections})
    cfg["runtime"]["progress"] = "off"
    assert main(["run", str(write_config(folder / "c.yaml", cfg))]) == 0
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        recorded = {name: f[name][()] for name in ("metrics/test_acc", "metrics/test_loss", "metrics/model_sha256",
                                                   "partition/samples")}
        recorded["test_indices"] = f["eval/test_indices"][()] if "eval/test_indices" in f else None
    return out, recorded


@pytest.fixture(scope="module")
def lr_run(tmp_path_factory):
    # eval.max_samples: the run evaluates on a seeded subsample of the test set, which the evaluator draws alike
    return finished_run(tmp_path_factory.mktemp("lr"), eval={"every": 1, "max_samples": 300})


@pytest.fixture(scope="module")
def evaluator(lr_run):
    return RunEvaluator.from_run(str(lr_run[0]))


def test_every_checkpoint_evaluates_to_the_recorded_test_figures(lr_run, evaluator):
    out, recorded = lr_run
    assert checkpoint_rounds(out) == [1, 2, 3]
    assert np.array_equal(evaluator.test_indices, recorded["test_indices"]) and len(evaluator.test_indices) == 300
    for r in (1, 2, 3):
        loss, acc = evaluator.evaluate(vector_at(out, r))
        # the same model, samples, batches and float64 batch sums in the same order: the same figures
        assert acc == recorded["metrics/test_acc"][r - 1]
        assert loss == pytest.approx(recorded["metrics/test_loss"][r - 1], rel=1e-12)
    final = final_vector(out)
    assert np.array_equal(final, vector_at(out, ROUNDS)) and np.array_equal(evaluator.final_vector(out), final)
    assert fingerprint(final) == recorded["metrics/model_sha256"][-1].decode()
    assert evaluator.utility("accuracy")(final) == recorded["metrics/test_acc"][-1]
    assert evaluator.utility("neg_loss")(final) == pytest.approx(-recorded["metrics/test_loss"][-1], rel=1e-12)


def test_clients_are_evaluated_on_the_union_of_their_training_samples(lr_run, evaluator):
    out, recorded = lr_run
    vec = final_vector(out)
    sizes = recorded["partition/samples"]
    assert evaluator.num_clients == len(sizes) == 6
    assert [len(evaluator.samples([c])[1]) for c in range(6)] == list(sizes)
    # the clients' sets are disjoint, so the union's figures are the sample-weighted means of each client's
    (l0, a0), (l2, a2) = evaluator.evaluate(vec, [0]), evaluator.evaluate(vec, [2])
    loss, acc = evaluator.evaluate(vec, [2, 0, 2])
    n0, n2 = sizes[0], sizes[2]
    assert len(evaluator.samples([0, 2])[1]) == n0 + n2
    # (a batch's loss is a float32 sum, and the union's batches group the samples differently: float32 rounding)
    assert loss == pytest.approx((n0 * l0 + n2 * l2) / (n0 + n2), rel=1e-6)
    assert acc == pytest.approx((n0 * a0 + n2 * a2) / (n0 + n2), abs=1e-12)
    assert 0.0 <= acc <= 1.0 and acc * (n0 + n2) == pytest.approx(round(acc * (n0 + n2)), abs=1e-9)


def test_bad_inputs_name_what_would_be_valid(lr_run, evaluator, tmp_path):
    out, _ = lr_run
    with pytest.raises(InputError, match=r"7850 entries"):
        evaluator.evaluate(np.zeros(5, dtype=np.float32))
    with pytest.raises(InputError, match=r"client ids in 0\.\.5"):
        evaluator.evaluate(final_vector(out), clients=[6])
    with pytest.raises(InputError, match=r"checkpoints after rounds: 1, 2, 3"):
        vector_at(out, 9)
    with pytest.raises(InputError, match="no run file"):
        RunEvaluator.from_run(str(tmp_path))


def test_a_cnn_run_with_the_fast_cpu_kernels_and_the_whole_test_set(tmp_path):
    out, recorded = finished_run(tmp_path, rounds=1, model={"name": "cnn_mnist"}, eval={"every": 1},
                                 server={"clients_per_round": 1})
    ev = RunEvaluator.from_run(str(out))
    assert ev.test_indices is None and recorded["test_indices"] is None
    loss, acc = ev.evaluate(final_vector(out))
    assert acc == recorded["metrics/test_acc"][-1]
    assert loss == pytest.approx(recorded["metrics/test_loss"][-1], rel=1e-9)


def test_the_evaluator_as_the_utility_of_a_round_game(lr_run, evaluator):
    # Round 2 replayed as one recorded update (round 1's checkpoint to round 2's, differences in float64 so that
    # start + delta is round 2's vector again): the lone client's Shapley value is v(N) - v(empty), the gain in
    # recorded test accuracy; two clients with that same update and weight share it equally.
    from fedmpi.analysis.contribution_rounds import RoundRecord, round_exact_shapley

    out, recorded = lr_run
    start, end = vector_at(out, 1), vector_at(out, 2)
    delta = end.astype(np.float64) - start.astype(np.float64)
    gain = recorded["metrics/test_acc"][1] - recorded["metrics/test_acc"][0]
    utility = evaluator.utility("accuracy")
    alone = round_exact_shapley({1: RoundRecord(start, {4: delta}, {4: 100.0})}, utility)
    assert alone == {4: pytest.approx(gain, abs=1e-12)}
    shared = round_exact_shapley({1: RoundRecord(start, {4: delta, 5: delta}, {4: 7.0, 5: 7.0})}, utility)
    assert shared == {4: pytest.approx(gain / 2, abs=1e-12), 5: pytest.approx(gain / 2, abs=1e-12)}
