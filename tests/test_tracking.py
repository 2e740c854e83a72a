"""Live tracking (runtime.trackers, fedmpi.run.tracking): what TensorBoard and MLflow hold, read back while the
run goes and after it, equals run.h5; a tracker that fails is reported once and changes nothing; --resume
continues the same tracker runs; W&B offline writes its run folder. In-process runs at world size 1."""

from __future__ import annotations

import glob
import os
import pathlib
import sys

import h5py
import numpy as np
import pytest
from conftest import read_clients, read_global, read_metrics, small_config, write_config

from fedmpi.cli import main
from fedmpi.io import series
from fedmpi.run import tracking as tracking_mod

ROUNDS = 3
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                        reason="pip install 'fedmpi[tensorboard]'")


def tracked_config(tmp_path, name, trackers, **runtime):
    out = tmp_path / name
    cfg = small_config(str(out), rounds=ROUNDS, checkpoint={"every": 1},
                       runtime={"threads": 1, "progress": "off", "trackers": trackers, **runtime})
    return write_config(tmp_path / f"{name}.yaml", cfg), out


def events(out):
    (folder,) = glob.glob(str(out / "tensorboard" / "run-*"))
    acc = event_accumulator.EventAccumulator(folder, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def mlflow_client(out):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=pathlib.Path(out, "mlruns").as_uri())


def mlflow_run_id(out):
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        return str(f.attrs["tracking_mlflow"])


def number_columns(metrics):
    """{tag: [round] values} of run.h5's /metrics as the trackers name them (1-D numbers, class_acc/k)."""
    cols = {k: v for k, v in metrics.items() if k != "round" and v.ndim == 1 and v.dtype.kind == "f"}
    for k, v in metrics.items():
        if v.ndim == 2:
            cols.update({f"{k}/{j}": v[:, j] for j in range(v.shape[1])})
    return cols


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The same run without trackers: the reference for fingerprints."""
    path, out = tracked_config(tmp_path_factory.mktemp("plain"), "plain", [])
    assert main(["run", str(path)]) == 0
    return read_metrics(out)[0], read_global(out)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A run with TensorBoard and MLflow; after each round's row the trackers' files are read back (the
    run is still going) and compared with run.h5 as it is on disk at that moment."""
    pytest.importorskip("mlflow", reason="pip install 'fedmpi[mlflow]' (mlflow-skinny)")
    path, out = tracked_config(tmp_path_factory.mktemp("tracked"), "tracked", ["tensorboard", "mlflow"])
    seen = []
    original = tracking_mod.Tracking.log_row

    def log_and_read_back(self, step, *args, **kwargs):
        original(self, step, *args, **kwargs)
        metrics, _ = read_metrics(out)          # the running job's file
        acc, client = events(out), mlflow_client(out)
        # the row of /metrics/round `step` (0 for the first round) is the trackers' 1-based step step + 1
        assert [e.step for e in acc.Scalars("train_loss")] == list(range(1, step + 2))
        assert acc.Scalars("train_loss")[-1].value == np.float32(metrics["train_loss"][step])
        history = client.get_metric_history(mlflow_run_id(out), "train_loss")
        assert [(m.step, m.value) for m in history][-1] == (step + 1, metrics["train_loss"][step])
        seen.append(step)

    mp = pytest.MonkeyPatch()
    mp.setattr(tracking_mod.Tracking, "log_row", log_and_read_back)
    try:
        assert main(["run", str(path)]) == 0
    finally:
        mp.undo()
    assert seen == list(range(ROUNDS))         # the rows' /metrics/round
    return out


def test_tensorboard_holds_every_number_of_metrics_and_the_client_histograms(tracked):
    metrics, _ = read_metrics(tracked)
    clients = read_clients(tracked)
    acc = events(tracked)
    expected = number_columns(metrics)
    timing = [t for t in acc.Tags()["scalars"] if t.startswith("timing/")]
    assert set(acc.Tags()["scalars"]) - set(timing) == set(expected)
    assert {t.split("/")[1] for t in timing} == {"train", "eval", "bcast", "reduce", "wait", "server"}
    for tag, values in expected.items():
        measured = np.flatnonzero(np.isfinite(values))
        points = acc.Scalars(tag)
        assert [p.step for p in points] == [int(metrics["round"][i]) + 1 for i in measured], tag
        np.testing.assert_array_equal([p.value for p in points], values[measured].astype(np.float32), err_msg=tag)
    assert set(acc.Tags()["histograms"]) == {f"clients/{k}" for k in clients}
    for name, table in clients.items():
        hists = acc.Histograms(f"clients/{name}")
        assert [h.step for h in hists] == list(range(1, ROUNDS + 1))
        for h, row in zip(hists, table):
            row = row[np.isfinite(row)].astype(np.float64)
            assert h.histogram_value.num == len(row) and sum(h.histogram_value.bucket) == len(row)
            assert h.histogram_value.min == row.min() and h.histogram_value.max == row.max()
            assert h.histogram_value.sum == pytest.approx(row.sum(), rel=1e-12)


def test_tensorboard_has_the_config_as_hyperparameters(tracked):
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = events(tracked)
    content = acc.PluginTagToContent("hparams")
    (blob,) = content.values()
    data = plugin_data_pb2.HParamsPluginData.FromString(blob)
    hp = data.session_start_info.hparams
    assert hp["client.lr"].number_value == 0.05 and hp["algorithm.name"].string_value == "fedavg"
    assert hp["partition.clients"].number_value == 12


def test_mlflow_holds_every_number_the_client_quantiles_and_the_config(tracked):
    metrics, _ = read_metrics(tracked)
    clients = read_clients(tracked)
    client = mlflow_client(tracked)
    run = client.get_run(mlflow_run_id(tracked))
    assert run.info.status == "FINISHED"
    assert run.data.params["client.lr"] == "0.05" and run.data.params["server.clients_per_round"] == "5"
    for tag, values in number_columns(metrics).items():
        measured = np.flatnonzero(np.isfinite(values))
        history = client.get_metric_history(run.info.run_id, tag)
        steps = [(int(metrics["round"][i]) + 1, values[i]) for i in measured]      # 1-based
        assert [(m.step, m.value) for m in history] == steps, tag
    # No histograms in MLflow: quartiles of the clients measured each round.
    loss = client.get_metric_history(run.info.run_id, "clients/loss/median")
    rows = [r[np.isfinite(r)].astype(np.float64) for r in clients["loss"]]
    assert [m.value for m in loss] == [float(np.median(r)) for r in rows]


def test_trackers_change_no_result(tracked, plain):
    metrics, model = plain
    assert np.array_equal(read_metrics(tracked)[0]["model_sha256"], metrics["model_sha256"])
    assert np.array_equal(read_global(tracked), model)


def test_a_failing_tracker_is_reported_once_and_the_run_finishes_unchanged(tmp_path, plain, capsys, monkeypatch):
    """TensorBoard raises while logging (every round: reported once), MLflow's server is unreachable (its
    start fails), W&B's package cannot be imported: the run finishes, exit 0, with the fingerprints and the
    model of the run without trackers."""
    pytest.importorskip("mlflow", reason="pip install 'fedmpi[mlflow]' (mlflow-skinny)")
    from fedmpi.run.tracking import tb_tracker

    def broken(self, *args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(tb_tracker.TensorBoardTracker, "log_round", broken)
    monkeypatch.setitem(sys.modules, "wandb", None)             # `import wandb` raises ImportError
    path, out = tracked_config(tmp_path, "failing", ["tensorboard", "mlflow", "wandb"],
                               tracking_uri="http://127.0.0.1:9")
    assert main(["run", str(path)]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "tracker" in line]
    assert len(lines) == 3, err
    assert lines[0].startswith("fedmpi: tracker mlflow dropped (cannot start: ") and "the run goes on" in lines[0]
    assert lines[1].startswith("fedmpi: tracker wandb dropped (cannot start: ") and "import of wandb" in lines[1]
    assert lines[2] == ("fedmpi: tracker tensorboard dropped (logging round 1 failed: RuntimeError: disk on fire); "
                        "the run goes on, run.h5 has every figure")
    metrics, attrs = read_metrics(out)
    assert attrs["status"] == "finished" and len(metrics["round"]) == ROUNDS
    assert "tracking_mlflow" not in attrs and "tracking_wandb" not in attrs
    assert np.array_equal(metrics["model_sha256"], plain[0]["model_sha256"])
    assert np.array_equal(read_global(out), plain[1])


def test_resume_continues_the_same_tracker_runs(tmp_path):
    """The newest checkpoint removed (a job killed after round 2's row, before its checkpoint): --resume
    recomputes rounds 2.. into the same TensorBoard folder (the earlier points from round 2 on dropped
    by TensorBoard) and the same MLflow run."""
    pytest.importorskip("mlflow", reason="pip install 'fedmpi[mlflow]' (mlflow-skinny)")
    out = tmp_path / "resumed"
    path = write_config(tmp_path / "resumed.yaml", {**small_config(str(out), rounds=ROUNDS, checkpoint={"every": 2}),
                        "runtime": {"threads": 1, "progress": "off", "trackers": ["tensorboard", "mlflow"]}})
    assert main(["run", str(path)]) == 0
    run_id, folder = mlflow_run_id(out), glob.glob(str(out / "tensorboard" / "run-*"))
    os.remove(out / "ckpt" / f"ckpt-{ROUNDS}.h5")
    assert main(["run", str(path), f"rounds={ROUNDS + 1}", "--resume"]) == 0
    metrics, attrs = read_metrics(out)
    assert mlflow_run_id(out) == run_id and glob.glob(str(out / "tensorboard" / "run-*")) == folder
    assert len(glob.glob(os.path.join(folder[0], "events.out.tfevents.*"))) == 2
    points = events(out).Scalars("train_loss")
    assert [p.step for p in points] == list(range(1, ROUNDS + 2))
    np.testing.assert_array_equal([p.value for p in points], metrics["train_loss"].astype(np.float32))
    history = mlflow_client(out).get_metric_history(run_id, "train_loss")
    assert [m.step for m in history] == [1, 2, 3, 3, 4]     # MLflow keeps both values of round 3, newest last
    assert [m.value for m in history][-2:] == list(metrics["train_loss"][2:])
    assert mlflow_client(out).get_run(run_id).info.status == "FINISHED"


def test_a_fork_hands_its_trackers_the_parent_rows_first(tracked, tmp_path):
    """--fork-from OUT@2: run.h5 starts with the parent's rows 0-1 (copied), and so does the fork's new
    TensorBoard run, before the round it computes itself."""
    path, out = tracked_config(tmp_path, "fork", ["tensorboard"])
    assert main(["run", str(path), "--fork-from", f"{tracked}@2"]) == 0
    metrics, attrs = read_metrics(out)
    assert attrs["parent_round"] == 2 and len(metrics["round"]) == ROUNDS
    acc = events(out)
    for tag, values in number_columns(metrics).items():
        measured = np.flatnonzero(np.isfinite(values))
        assert [p.step for p in acc.Scalars(tag)] == list(measured + 1), tag
        np.testing.assert_array_equal([p.value for p in acc.Scalars(tag)], values[measured].astype(np.float32))
    assert [h.step for h in acc.Histograms("clients/loss")] == list(range(1, ROUNDS + 1))
    assert [p.step for p in acc.Scalars("timing/train/rank0")] == list(range(1, ROUNDS + 1))


def test_wandb_offline_writes_its_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B is not installed (pip install 'fedmpi[wandb]'); not in the test extra")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)          # no key: offline
    path, out = tracked_config(tmp_path, "wandb", ["wandb"])
    assert main(["run", str(path)]) == 0
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        run_id = str(f.attrs["tracking_wandb"])
    (folder,) = glob.glob(str(out / "wandb" / f"offline-run-*-{run_id}"))
    assert os.path.getsize(os.path.join(folder, f"run-{run_id}.wandb")) > 0


# --- the shared naming rules (fedmpi.io.series), on a hand-made row ---------------------------------------

def test_row_scalars_name_columns_layers_and_timing_as_the_export_does():
    row = {"round": 4, "test_acc": np.nan, "train_loss": 0.5, "model_sha256": "ab12", "zeta": 2.0,
           "class_acc": np.array([0.1, np.nan]), "weight_divergence_layers": np.array([3.0, 4.0])}
    attrs = {"weight_divergence_layers": {"layers": [b"fc.weight", b"fc.bias"]}}
    timing = np.zeros((2, 6))
    timing[1, 0] = 7.0      # rank 1's train
    got = series.row_scalars(row, attrs, timing)
    tags = [t for t, _ in got]
    assert tags[:3] == ["train_loss", "zeta", "class_acc/0"]
    assert dict(got)["weight_divergence_layers/fc.bias"] == 4.0 and dict(got)["timing/train/rank1"] == 7.0
    assert "test_acc" not in tags and "class_acc/1" not in tags and "round" not in tags
    assert not any("sha" in t for t in tags)
    assert tags[-12:] == [f"timing/{p}/rank{r}" for p in sorted(["train", "eval", "bcast", "reduce", "wait",
                                                                 "server"]) for r in (0, 1)]


def test_quantiles_and_flat_params_on_hand_cases():
    q = series.quantiles(np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert q == {"min": 1.0, "q25": 2.0, "median": 3.0, "q75": 4.0, "max": 5.0, "mean": 3.0}
    assert series.flat_params({"a": 1, "b": {"c": [1, 2], "d": {"e": None}}}) == {"a": 1, "b.c": [1, 2],
                                                                                  "b.d.e": None}
