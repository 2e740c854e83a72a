"""`fedmpi export RUN --tensorboard DIR --csv FILE`: what is written is read back (TensorBoard's own
EventAccumulator, the csv module) and compared with the run file's values."""

from __future__ import annotations

import csv
import glob
import sys

import h5py
import numpy as np
import pytest
from run_files import CLASSES, LAYERS, PHASES, write_run

from fedmpi.cli import main as fedmpi_main
from fedmpi.io.store import client_table


def export(capsys, *args):
    code = fedmpi_main(["export", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def load_events(folder):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                            reason="pip install 'fedmpi[tensorboard]'")
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def metrics_of(path):
    with h5py.File(path, "r") as f:
        metrics = {k: ds[()] for k, ds in f["metrics"].items()}
        table = client_table(f)
        clients = {k: table.dense(k) for k in table.names}
        timing = {k: ds[()] for k, ds in f["timing"].items()} if "timing" in f else {}
    return metrics, clients, timing


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run" / "run.h5", rounds=8, eval_every=2)


def test_tensorboard_scalars_are_the_run_figures(run, tmp_path, capsys):
    code, out, err = export(capsys, run, "--tensorboard", tmp_path / "tb")
    assert code == 0, err
    m, _, timing = metrics_of(run)
    acc = load_events(tmp_path / "tb")
    scalars = set(acc.Tags()["scalars"])
    one_d = {k for k, v in m.items() if v.ndim == 1 and v.dtype.kind == "f" and k != "round"}
    expected = one_d | {f"class_acc/{c}" for c in range(CLASSES)} | {f"weight_divergence_layers/{n}" for n in LAYERS}
    expected |= {f"timing/{p}/rank{r}" for p in PHASES for r in range(3)}
    assert scalars == expected
    for tag, values in [(k, m[k]) for k in one_d] + [("class_acc/2", m["class_acc"][:, 2]),
                                                     ("weight_divergence_layers/fc.bias",
                                                      m["weight_divergence_layers"][:, 1]),
                                                     ("timing/reduce/rank1", timing["reduce"][:, 1])]:
        events = acc.Scalars(tag)
        measured = np.flatnonzero(np.isfinite(values))          # rounds without a value are left out
        assert [e.step for e in events] == [int(m["round"][i]) + 1 for i in measured], tag     # 1-based
        np.testing.assert_array_equal([e.value for e in events], values[measured].astype(np.float32), err_msg=tag)
    # Evaluated every second round: test_acc has 4 points of 8.
    assert len(acc.Scalars("test_acc")) == 4 and len(acc.Scalars("train_loss")) == 8
    # TensorBoard's relative time is training time: the run's start plus wall_s.
    walls = [e.wall_time for e in acc.Scalars("train_loss")]
    np.testing.assert_allclose(np.diff(walls), np.diff(m["wall_s"]), atol=1e-6)
    assert "scalar points" in out and str(tmp_path / "tb") in out


def test_tensorboard_histograms_are_the_clients_of_each_round(run, tmp_path, capsys):
    assert export(capsys, run, "--tensorboard", tmp_path / "tb")[0] == 0
    m, clients, _ = metrics_of(run)
    acc = load_events(tmp_path / "tb")
    assert set(acc.Tags()["histograms"]) == {"clients/update_norm", "clients/update_cosine"}
    for name in ("update_norm", "update_cosine"):
        events = acc.Histograms(f"clients/{name}")
        assert [e.step for e in events] == [int(r) + 1 for r in m["round"]]
        for e, row in zip(events, clients[name]):
            values = row[np.isfinite(row)].astype(np.float64)   # the clients measured that round
            h = e.histogram_value
            assert h.num == len(values) and sum(h.bucket) == len(values)
            assert h.min == pytest.approx(values.min()) and h.max == pytest.approx(values.max())
            assert h.sum == pytest.approx(values.sum()) and h.sum_squares == pytest.approx((values ** 2).sum())
            # Each value lies in the bucket (limit[i-1], limit[i]] it is counted in.
            limits = np.asarray(h.bucket_limit)
            counted = np.bincount(np.searchsorted(limits, values, side="left"), minlength=len(limits))
            np.testing.assert_array_equal(counted, h.bucket)


def test_csv_has_one_row_per_round_with_every_figure(run, tmp_path, capsys):
    code, out, _ = export(capsys, run, "--csv", tmp_path / "run.csv")
    assert code == 0 and "8 rows written" in out
    m, _, timing = metrics_of(run)
    rows = list(csv.DictReader(open(tmp_path / "run.csv")))
    assert [r["round"] for r in rows] == [str(i) for i in range(1, 9)]        # 1-based, as on the console

    def column(name):
        return np.array([float(r[name]) if r[name] else np.nan for r in rows])

    for name in ("test_acc", "weight_divergence", "gradient_diversity", "sim_time_s", "wall_s"):
        np.testing.assert_array_equal(column(name), m[name])             # exact: written with repr
    np.testing.assert_array_equal(column("class_acc/3"), m["class_acc"][:, 3])
    np.testing.assert_array_equal(column("weight_divergence_layers/fc.weight"), m["weight_divergence_layers"][:, 0])
    np.testing.assert_array_equal(column("timing/train/rank2"), timing["train"][:, 2])
    assert [r["model_sha256"] for r in rows] == [v.decode() for v in m["model_sha256"]]
    assert rows[0]["test_acc"] == "" and rows[1]["test_acc"] != ""      # not evaluated: empty


def test_an_older_file_exports_what_it_has(tmp_path, capsys):
    old = write_run(tmp_path / "old" / "run.h5", fingerprints=False, instruments=False, timing=False)
    code, out, _ = export(capsys, old.parent, "--tensorboard", tmp_path / "tb", "--csv", tmp_path / "old.csv")
    assert code == 0 and "0 client histograms" in out
    acc = load_events(tmp_path / "tb")
    assert set(acc.Tags()["scalars"]) == {"test_acc", "test_loss", "train_loss", "wall_s", "bytes_up", "bytes_down",
                                          "uploads"}
    assert list(csv.DictReader(open(tmp_path / "old.csv")))[0].keys() == {
        "round", "test_acc", "test_loss", "train_loss", "wall_s", "bytes_up", "bytes_down", "uploads"}


def test_a_running_file_exports_its_complete_rounds(run, tmp_path, capsys):
    with h5py.File(run, "a") as f:          # the writer has appended `round` of a 9th row, nothing else yet
        f.attrs["status"] = "running"
        rounds = f["metrics/round"][()]
        del f["metrics/round"]
        f["metrics/round"] = np.append(rounds, 8.0)
    code, out, _ = export(capsys, run, "--csv", tmp_path / "r.csv", "--tensorboard", tmp_path / "tb")
    assert code == 0 and "8 rounds, status running" in out
    assert len(list(csv.DictReader(open(tmp_path / "r.csv")))) == 8
    assert max(e.step for e in load_events(tmp_path / "tb").Scalars("train_loss")) == 8       # round 8, 1-based


def test_earlier_event_files_are_kept_unless_overwrite(run, tmp_path, capsys):
    assert export(capsys, run, "--tensorboard", tmp_path / "tb")[0] == 0
    [first] = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    code, _, err = export(capsys, run, "--tensorboard", tmp_path / "tb")
    assert code == 2 and "already holds 1 TensorBoard event file" in err and "--overwrite" in err
    assert glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*")) == [first]
    assert export(capsys, run, "--tensorboard", tmp_path / "tb", "--overwrite")[0] == 0
    files = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert len(files) == 1
    assert len(load_events(tmp_path / "tb").Scalars("train_loss")) == 8     # one export's points, not two


def test_bad_inputs_and_places_exit_2_naming_them(run, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")        # missing folders are made (mkdir -p); a file in the way is not
    cases = [
        ([run], "nothing to export"),
        ([tmp_path / "none", "--csv", tmp_path / "x.csv"], str(tmp_path / "none")),
        ([run, "--csv", tmp_path / "a-file" / "x.csv"], f"{tmp_path / 'a-file'} is a file"),
        ([run, "--csv", tmp_path], f"--csv {tmp_path}: is a folder"),
        ([run, "--tensorboard", tmp_path / "a-file" / "deeper"], f"{tmp_path / 'a-file'} is a file"),
        ([run, "--tensorboard", run], f"--tensorboard {run}: is a file"),
    ]
    for args, named in cases:
        code, _, err = export(capsys, *args)
        assert code == 2 and named in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "x.csv").exists()


def test_missing_tensorboard_package_exits_2_with_the_pip_command(run, tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.setitem(sys.modules, name, None)          # None in sys.modules: the import fails
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    code, _, err = export(capsys, run, "--tensorboard", tmp_path / "tb", "--csv", tmp_path / "x.csv")
    assert code == 2 and "pip install 'fedmpi[tensorboard]'" in err
    assert not (tmp_path / "tb").exists() and not (tmp_path / "x.csv").exists()     # nothing half-written
