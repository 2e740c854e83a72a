"""What a person follows while a run goes (issue 40): rounds without an evaluation show `-` (not nan) or the last
evaluation marked with its round, local and backdoor accuracy appear where they are measured, a long evaluation is
announced and timed; and eval.max_samples evaluates a fixed, seeded subsample of the global test set, recorded in
run.h5 (/eval/test_indices), with the figures of one evaluator on exactly those samples."""

from __future__ import annotations

import io
import math

import h5py
import numpy as np
import pytest
from conftest import small_config, write_config

from fedmpi import config as fedmpi_config
from fedmpi.cli import main
from fedmpi.core.errors import ConfigError
from fedmpi.round.evaluation import eval_subset
from fedmpi.run.progress import Progress


def lines_of(stream):
    return stream.getvalue().strip().splitlines()


def test_rounds_without_an_evaluation_show_a_dash_then_the_last_evaluation_with_its_round():
    out = io.StringIO()
    progress = Progress(4, 0, "lines", stream=out)
    nan = math.nan
    for t, acc in enumerate((nan, 0.5, nan, 0.75)):
        progress._last_line = -math.inf         # a line every round (lines are rate-limited to one per 10 s)
        progress.update(t, {"test_acc": acc, "test_loss": 2 * acc}, 0.25)
    first, second, third, fourth = lines_of(out)
    assert first == "round 1/4  acc -  loss -  0.25 s/round"
    assert second == "round 2/4  acc 0.5000  loss 1.0000  0.25 s/round"
    assert third == "round 3/4  acc 0.5000  loss 1.0000  [round 2]  0.25 s/round"      # evaluated in round 2
    assert fourth == "round 4/4  acc 0.7500  loss 1.5000  0.25 s/round"
    assert "nan" not in out.getvalue()


def test_local_and_backdoor_accuracy_are_shown_where_measured():
    out = io.StringIO()
    progress = Progress(2, 0, "lines", stream=out)
    progress.update(0, {"test_acc": 0.5, "test_loss": 1.0, "backdoor_acc": 0.125}, 1.0)
    progress._last_line = -math.inf
    progress.update(1, {"test_acc": 0.625, "test_loss": 0.9, "local_acc_mean": 0.875, "backdoor_acc": 0.25}, 1.0)
    first, second = lines_of(out)
    assert first == "round 1/2  acc 0.5000  loss 1.0000  backdoor 0.1250  1.00 s/round"
    assert second == "round 2/2  acc 0.6250  loss 0.9000  local 0.8750  backdoor 0.2500  1.00 s/round"


def test_a_long_evaluation_is_announced_before_it_and_timed_after_it():
    out = io.StringIO()
    # The first evaluation on a large test set is announced; a later one when the one before it was long.
    progress = Progress(3, 0, "lines", stream=out, notice_s=0.0, notice_samples=1000)
    with progress.evaluation(0, 5000):
        pass
    with progress.evaluation(1, 5000):
        pass
    lines = lines_of(out)
    assert lines[0] == "round 1/3  evaluating the global model on 5000 test samples"
    assert lines[1].startswith("round 1/3  evaluated in ") and lines[1].endswith(" s")
    assert lines[2].startswith("round 2/3  evaluating the global model on 5000 test samples (the last evaluation "
                               "took ")
    quiet = io.StringIO()
    short = Progress(3, 0, "lines", stream=quiet, notice_s=1e9, notice_samples=1000)
    with short.evaluation(0, 999):          # small set, first evaluation: nothing to announce
        pass
    with short.evaluation(1, 999):          # the previous one was short
        pass
    assert quiet.getvalue() == ""


def test_max_samples_is_a_seeded_fixed_subsample():
    a, b = eval_subset(1000, 300, seed=4), eval_subset(1000, 300, seed=4)
    np.testing.assert_array_equal(a, b)
    assert len(np.unique(a)) == 300 and np.all(np.diff(a) > 0) and a[-1] < 1000
    assert not np.array_equal(a, eval_subset(1000, 300, seed=5))
    assert eval_subset(1000, None, seed=4) is None


@pytest.mark.parametrize("value", [0, -3, 2.5, "many"])
def test_max_samples_out_of_range_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError) as e:
        fedmpi_config.from_dict({**small_config("unused"), "eval": {"max_samples": value}})
    assert any(m.startswith("eval.max_samples") for m in e.value.messages), e.value.messages


def test_max_samples_not_below_the_test_set_is_refused_by_resolve(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out", eval={"max_samples": 1000}))
    assert main(["run", str(cfg), "--dry-run"]) == 2            # mnist5k's test set holds 1,000 samples
    err = capsys.readouterr().err
    assert "eval.max_samples = 1000: the global test set holds 1000 samples" in err
    assert not (tmp_path / "out").exists()


def test_a_run_shows_its_progress_and_evaluates_its_recorded_subsample(tmp_path, capfd):
    cfg = small_config(tmp_path / "out", rounds=2, eval={"every": 2, "max_samples": 300},
                       attack={"name": "backdoor", "fraction": 0.2, "target": 0},
                       runtime={"threads": 1, "progress": "lines"})
    assert main(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == 0
    err = capfd.readouterr().err
    progress = [line for line in err.splitlines() if line.startswith("round ")]
    assert progress[-1].startswith("round 2/2  acc 0.") and " backdoor 0." in progress[-1]
    assert "nan" not in err
    with h5py.File(tmp_path / "out" / "run.h5", "r") as f:
        indices = f["eval/test_indices"][()]
        acc = f["metrics/test_acc"][()]
        counts = f["metrics/class_acc"].attrs["class_counts"]
    np.testing.assert_array_equal(indices, eval_subset(1000, 300, seed=1))
    assert counts.sum() == 300                          # the evaluation's test set is the subsample
    assert np.isnan(acc[0]) and np.isfinite(acc[1])
    assert (acc[1] * 300) == pytest.approx(round(acc[1] * 300))     # a share of the 300 samples


def test_the_run_loops_evaluation_is_announced_with_its_round():
    """fedmpi.run.launch wraps rank 0's global evaluation: each run inside Progress.evaluation, for the round set."""
    from fedmpi.run.progress import AnnouncedEvaluation

    class Evaluation:
        n, class_counts = 4000, np.array([1, 2])

        def run(self, vec):
            return ("figures of", vec)

    out = io.StringIO()
    announced = AnnouncedEvaluation(Evaluation(), Progress(9, 0, "lines", stream=out, notice_s=0.0,
                                                           notice_samples=1000))
    announced.round_ = 6
    assert announced.run("x") == ("figures of", "x") and announced.n == 4000
    np.testing.assert_array_equal(announced.class_counts, [1, 2])
    assert lines_of(out)[0] == "round 7/9  evaluating the global model on 4000 test samples"
