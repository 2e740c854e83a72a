"""`fedmpi verify RUN_A RUN_B`: the first round where two runs' models part, their config differences,
versions and -n, the tolerance report across process counts, exit 0/1/2. Run files written by the tests
in the run log's layout (tests/run_files.py), and one pair of real runs."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
from conftest import run_many, small_config, write_config
from run_files import base_config, figures, models, sha, write_run

from fedmpi.analysis import verify
from fedmpi.cli import main as fedmpi_main


def run_verify(capsys, a, b):
    code = fedmpi_main(["verify", str(a), str(b)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def verdict(text):
    [line] = [line for line in text.splitlines() if line.startswith("verdict: ")]
    return line


# --- the same -n: fingerprints decide -------------------------------------------------------------------

def test_identical_runs_exit_0_through_their_last_round(tmp_path, capsys):
    a, b = write_run(tmp_path / "a" / "run.h5"), write_run(tmp_path / "b" / "run.h5")
    code, out, _ = run_verify(capsys, a.parent, b)          # a run folder or its run.h5
    assert code == 0
    assert verdict(out) == "verdict: identical through round 6 (6 rounds compared by model fingerprint)"  # 1-based
    assert "final model (/model/global): bit-identical (after round 6)" in out
    # The only config difference is out, a run-time key, marked as such.
    [diff] = [line for line in out.splitlines() if " out " in line and str(tmp_path / "a") in line]
    assert diff.split()[:2] == ["*", "out"] and str(tmp_path / "b") in diff


def test_runs_that_part_name_the_first_differing_round(tmp_path, capsys):
    a = write_run(tmp_path / "a" / "run.h5")
    b = write_run(tmp_path / "b" / "run.h5", perturb_from=3, scale=1e-3,
                  config=base_config(tmp_path / "b", client={"lr": 0.1, "batch_size": 10}))
    code, out, _ = run_verify(capsys, a, b)
    assert code == 1
    assert verdict(out) == ("verdict: differ: first difference at round 4 by model fingerprint, identical "
                            "through round 3")           # the fourth round, /metrics/round 3, parts
    [lr] = [line.split() for line in out.splitlines() if "client.lr" in line]
    assert lr == ["client.lr", "0.05", "0.1"]                 # not a run-time key: no mark
    # The table of largest differences: test_acc parts by exactly the factor written, at the round written.
    acc_a, acc_b = figures(6)[0]["test_acc"], figures(6, 3, 1e-3)[0]["test_acc"]
    rel = np.abs(acc_a - acc_b) / np.maximum(np.abs(acc_a), np.abs(acc_b))
    [row] = [line.split() for line in out.splitlines() if line.startswith("test_acc ")]
    assert float(row[1]) == pytest.approx(rel.max(), rel=1e-2) and row[2] == str(int(np.argmax(rel)) + 1)
    assert row[3] == "NO"


def test_a_different_seed_differs_at_the_first_round(tmp_path, capsys):
    a = write_run(tmp_path / "a" / "run.h5")
    b = write_run(tmp_path / "b" / "run.h5", perturb_from=0, scale=0.5, config=base_config(tmp_path / "b", seed=1))
    code, out, _ = run_verify(capsys, a, b)
    assert code == 1 and "first difference at round 1 by model fingerprint, the first round both have" in out
    [seed] = [line.split() for line in out.splitlines() if line.lstrip().startswith("seed ")]
    assert seed == ["seed", "0", "1"]


def test_running_and_preempted_runs_are_compared_over_the_rounds_both_have(tmp_path, capsys):
    a = write_run(tmp_path / "a" / "run.h5")
    running = write_run(tmp_path / "r" / "run.h5", rounds=4, status="running", model=False)
    # A job mid-append: the round of row 4 is written, its other figures not yet.
    with h5py.File(running, "a") as f:
        rounds = f["metrics/round"][()]
        del f["metrics/round"]
        f["metrics/round"] = np.append(rounds, 4.0)
    code, out, _ = run_verify(capsys, a, running)
    assert code == 0 and verdict(out).startswith("verdict: identical through round 4 (4 rounds")
    assert "note: B is running: compared up to its last complete round" in out
    assert "final model (/model/global): not compared: B has no /model/global" in out
    preempted = write_run(tmp_path / "p" / "run.h5", rounds=4, status="preempted")
    code, out, _ = run_verify(capsys, preempted, a)
    assert code == 0 and "identical through round 4" in out
    assert "not compared: A ends after round 4, B after round 6" in out
    # A preempted run that parts from the other is still caught.
    parted = write_run(tmp_path / "q" / "run.h5", rounds=4, status="preempted", perturb_from=2, scale=1e-6)
    code, out, _ = run_verify(capsys, a, parted)
    assert code == 1 and "first difference at round 3" in out


def test_final_models_are_compared_and_checked_against_their_fingerprint(tmp_path, capsys):
    a, b = write_run(tmp_path / "a" / "run.h5"), write_run(tmp_path / "b" / "run.h5")
    with h5py.File(b, "a") as f:
        f["model/global"][3] += np.float32(0.5)
    code, out, _ = run_verify(capsys, a, b)
    assert code == 1
    assert "note: B's /model/global does not match its last fingerprint (round 6)" in out
    assert "final model (/model/global): differ: largest difference 0.5" in out
    assert verdict(out) == "verdict: differ: the final models differ although every compared round agrees"


def test_versions_and_process_counts_of_both_runs_are_shown(tmp_path, capsys):
    a = write_run(tmp_path / "a" / "run.h5")
    b = write_run(tmp_path / "b" / "run.h5", attrs={"version_torch": "2.13.0", "parent_out": "runs/x",
                                                    "parent_round": 4})
    _, out, _ = run_verify(capsys, a, b)
    table = {line[2:].split()[0]: line for line in out.splitlines()[:20] if line[2:].split()}
    assert table["torch"].startswith("* ") and table["torch"].split()[2:] == ["2.14.1", "2.13.0"]
    assert table["numpy"].startswith("  ") and table["numpy"].split()[1:] == ["2.4.6", "2.4.6"]
    assert table["-n"].split()[-2:] == ["1", "1"]
    assert "runs/x @ round 4" in table["fork"]


# --- across process counts: the documented tolerance --------------------------------------------------------

@pytest.mark.parametrize("scale, within", [(3e-7, True), (2e-4, False)])
def test_different_process_counts_are_judged_against_the_documented_tolerance(tmp_path, capsys, scale, within):
    a = write_run(tmp_path / "a" / "run.h5", world_size=1)
    b = write_run(tmp_path / "b" / "run.h5", world_size=3, perturb_from=0, scale=scale)
    code, out, _ = run_verify(capsys, a, b)
    assert "process counts differ (-n 1 and -n 3)" in out and "1e-05 relative" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("test_acc", "class_acc", "bytes_up", "/model/global")}
    # Every perturbed figure is off by scale / (1 + scale) relative (hand computation), the rest by 0.
    assert float(rows["test_acc"][1]) == pytest.approx(scale / (1 + scale), rel=1e-2)
    assert float(rows["class_acc"][1]) == pytest.approx(scale / (1 + scale), rel=1e-2)
    assert rows["bytes_up"][1:3] == ["0", "-"]
    ma, mb = models(6)[-1], models(6, 0, scale)[-1]
    expected = np.abs(ma.astype(np.float64) - mb).max() / max(np.abs(ma).max(), np.abs(mb).max())
    assert float(rows["/model/global"][1]) == pytest.approx(expected, rel=1e-2)
    assert rows["test_acc"][-1] == ("yes" if within else "NO")
    assert code == (0 if within else 1)
    assert ("within the documented tolerance" in verdict(out)) == within


def test_relative_difference_by_hand():
    rel = verify.relative_difference([1.0, 0.0, 2.0, np.nan, np.nan, -4.0], [1.0, 0.0, 2.5, np.nan, 1.0, 4.0])
    np.testing.assert_array_equal(rel, [0.0, 0.0, 0.5 / 2.5, 0.0, np.inf, 2.0])


# --- files without fingerprints ---------------------------------------------------------------------------

def test_files_without_fingerprints_are_compared_by_metrics_and_model(tmp_path, capsys):
    old = dict(fingerprints=False, instruments=False, timing=False)
    a = write_run(tmp_path / "a" / "run.h5", **old)
    b = write_run(tmp_path / "b" / "run.h5", **old)
    code, out, _ = run_verify(capsys, a, b)
    assert code == 0 and "note: model fingerprints not recorded in A and B" in out
    assert verdict(out) == ("verdict: identical through round 6 (6 rounds compared by per-round metrics and "
                            "final model)")
    parted = write_run(tmp_path / "c" / "run.h5", perturb_from=4, scale=1e-6, **old)
    code, out, _ = run_verify(capsys, a, parted)
    assert code == 1
    assert verdict(out) == ("verdict: differ: first difference at round 5 (test_acc, test_loss, train_loss) by "
                            "per-round metrics and final model, identical through round 4")
    # One side with fingerprints, the other without: still compared, and said so.
    new = write_run(tmp_path / "d" / "run.h5")
    code, out, _ = run_verify(capsys, new, a)
    assert code == 0 and "fingerprints not recorded in B" in out


def test_wall_time_is_not_taken_for_a_difference(tmp_path, capsys):
    a, b = write_run(tmp_path / "a" / "run.h5"), write_run(tmp_path / "b" / "run.h5", fingerprints=False)
    with h5py.File(b, "a") as f:
        f["metrics/wall_s"][...] = f["metrics/wall_s"][()] * 3
    code, out, _ = run_verify(capsys, a, b)
    assert code == 0 and "wall_s" not in out


# --- bad inputs: exit 2 naming the file -------------------------------------------------------------------

def test_missing_or_malformed_files_exit_2_naming_them(tmp_path, capsys):
    good = write_run(tmp_path / "a" / "run.h5")
    code, _, err = run_verify(capsys, good, tmp_path / "nowhere")
    assert code == 2 and str(tmp_path / "nowhere") in err and "no run file there" in err
    text = tmp_path / "text" / "run.h5"
    text.parent.mkdir()
    text.write_text("not hdf5")
    code, _, err = run_verify(capsys, text, good)
    assert code == 2 and str(text) in err
    broken = tmp_path / "broken" / "run.h5"
    broken.parent.mkdir()
    shutil.copy(good, broken)
    with h5py.File(broken, "a") as f:
        f.attrs["config"] = "seed: [unclosed"
    code, _, err = run_verify(capsys, good, broken)
    assert code == 2 and str(broken) in err and "config attribute: not valid YAML" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_fingerprint_is_the_sha256_of_the_float32_bytes():
    vec = np.array([1.0, -2.5, 3.25], dtype=np.float32)
    assert verify.fingerprint(vec) == sha(vec)
    assert verify.fingerprint(vec.astype(np.float64)) == sha(vec)      # hashed as float32 whatever it came as
    assert verify.fingerprint(vec) != verify.fingerprint(vec + np.float32(1e-7))


# --- real runs --------------------------------------------------------------------------------------------

@pytest.mark.mpi
def test_real_runs_same_config_identical_other_seed_differs_at_once(tmp_path, capsys):
    configs = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        cfg = small_config(tmp_path / name, rounds=2, seed=seed, checkpoint={"every": 0})
        configs.append(write_config(tmp_path / f"{name}.yaml", cfg))
    run_many(1, configs)
    code, out, _ = run_verify(capsys, tmp_path / "a", tmp_path / "b")
    assert code == 0, out
    assert verdict(out).startswith("verdict: identical through round 2 (2 rounds")
    assert "final model (/model/global): bit-identical (after round 2)" in out
    assert "torch" in out and "-n (world_size)" in out
    code, out, _ = run_verify(capsys, tmp_path / "a", tmp_path / "c")
    assert code == 1, out
    first = verdict(out).split("first difference at round ")[1].split()[0]
    assert first in ("1", "2")
    [seed] = [line.split() for line in out.splitlines() if line.lstrip().startswith("seed ")]
    assert seed == ["seed", "1", "2"]
