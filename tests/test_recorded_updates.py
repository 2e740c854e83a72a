"""checkpoint.updates: every counted client's update recorded on its host (fedmpi.uploads.record) and read back
merged over the rank files (fedmpi.uploads.recorded). The recorder changes no result; what it records is what the
server sums; the record is the same at -n 1 and -n 3."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import session_runs
import torch
from conftest import read_global, read_metrics, same, small_config, write_config

from fedmpi.cli import main
from fedmpi.config import CheckpointConfig
from fedmpi.core.errors import InputError
from fedmpi.uploads import record
from fedmpi.uploads.base import ClientUpdate
from fedmpi.uploads.record import UpdateRecorder, rank_file
from fedmpi.uploads.recorded import read_updates, update_norms


def upload(cid, t, start, vector, weight):
    return ClientUpdate(cid=cid, round=t, vector=torch.tensor(vector, dtype=torch.float32),
                        start=torch.tensor(start, dtype=torch.float32), weight=weight)


def test_the_recorder_writes_delta_weight_norm_and_start_and_passes_the_update_on(tmp_path):
    recorder = UpdateRecorder(rank_file(tmp_path, 2))
    update = upload(7, 0, [1.0, 2.0, 3.0], [1.5, 2.0, 2.0], 40.0)
    passed = recorder.client(update, view=None)
    assert passed is update
    assert torch.equal(update.vector, torch.tensor([1.5, 2.0, 2.0]))       # untouched
    with h5py.File(tmp_path / "updates" / "rank-2.h5", "r") as f:
        assert np.array_equal(f["round_0/start"][()], np.float32([1, 2, 3]))
        data = f["round_0/client_7"]
        assert data.dtype == np.float32
        assert np.array_equal(data[()], np.float32([0.5, 0.0, -1.0]))
        assert data.attrs["weight"] == 40.0
        assert data.attrs["norm"] == pytest.approx(np.sqrt(1.25), rel=1e-15)


def test_a_new_process_replaces_the_rounds_it_recomputes(tmp_path):
    """A resumed run recomputes the rounds after its checkpoint: its first write to a round replaces the
    group the interrupted run left (a client of the old group does not survive), later writes add to it."""
    path = rank_file(tmp_path, 1)
    old = UpdateRecorder(path)
    old.client(upload(1, 0, [0.0, 0.0], [1.0, 1.0], 1.0), None)
    old.client(upload(1, 1, [1.0, 1.0], [9.0, 9.0], 1.0), None)
    old.client(upload(2, 1, [1.0, 1.0], [9.0, 9.0], 1.0), None)
    resumed = UpdateRecorder(path)
    resumed.client(upload(3, 1, [1.0, 1.0], [2.0, 0.0], 3.0), None)
    resumed.client(upload(4, 1, [1.0, 1.0], [1.0, 3.0], 5.0), None)
    rounds = read_updates(tmp_path)
    assert sorted(rounds) == [0, 1]
    assert sorted(rounds[0].deltas) == [1]
    assert sorted(rounds[1].deltas) == [3, 4]
    assert np.array_equal(rounds[1].deltas[3], np.float32([1, -1]))
    assert np.array_equal(rounds[1].deltas[4], np.float32([0, 2]))
    assert rounds[1].weights == {3: 3.0, 4: 5.0}


def test_the_reader_merges_the_rank_files(tmp_path):
    UpdateRecorder(rank_file(tmp_path, 1)).client(upload(0, 0, [1.0], [3.0], 2.0), None)
    UpdateRecorder(rank_file(tmp_path, 2)).client(upload(5, 0, [1.0], [0.0], 4.0), None)
    UpdateRecorder(rank_file(tmp_path, 2)).client(upload(5, 1, [2.0], [6.0], 4.0), None)
    rounds = read_updates(tmp_path)
    assert {t: sorted(r.deltas) for t, r in rounds.items()} == {0: [0, 5], 1: [5]}
    assert np.array_equal(rounds[0].start, np.float32([1]))
    assert np.array_equal(rounds[1].start, np.float32([2]))
    assert rounds[0].deltas[0][0] == 2.0 and rounds[0].deltas[5][0] == -1.0
    assert update_norms(tmp_path) == {0: {0: 2.0, 5: 1.0}, 1: {5: 4.0}}


def test_a_missing_or_damaged_recording_is_refused_by_name(tmp_path):
    with pytest.raises(InputError, match="updates: no recorded client updates"):
        read_updates(tmp_path)
    (tmp_path / "updates").mkdir()
    with pytest.raises(InputError, match="holds no rank-<R>.h5"):
        read_updates(tmp_path)
    (tmp_path / "updates" / "rank-1.h5").write_bytes(b"not an HDF5 file at all")
    with pytest.raises(InputError, match="rank-1.h5: cannot be read as recorded client updates"):
        update_norms(tmp_path)


def test_algorithms_whose_server_never_sees_one_update_are_refused():
    on = CheckpointConfig(updates=True)
    assert record.problems(CheckpointConfig(), protocol="buffer", secure_aggregation="pairwise",
                           algorithm_name="fedbuff") == []
    assert record.problems(on, protocol="reduce", secure_aggregation="none", algorithm_name="fedavg") == []
    [line] = record.problems(on, protocol="buffer", secure_aggregation="none", algorithm_name="fedbuff")
    assert line.startswith("checkpoint.updates:") and "'fedbuff' uploads by 'buffer'" in line
    [line] = record.problems(on, protocol="reduce", secure_aggregation="pairwise", algorithm_name="fedavg")
    assert line.startswith("checkpoint.updates:") and "secure_aggregation" in line


def test_a_refused_combination_exits_2(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "run", algorithm={"name": "fedbuff",
                                                                                        "concurrency": 5},
                                                         checkpoint={"updates": True}))
    assert main(["run", str(cfg)]) == 2
    assert "checkpoint.updates: records each client's update" in capsys.readouterr().err


def test_recording_changes_nothing_and_records_what_the_server_sums(tmp_path):
    """Bitwise the same model with and without the recorder; FedAvg's next start is the start plus the
    recorded deltas' weighted mean (the server sums in float64, then rounds to float32)."""
    plain, recorded = tmp_path / "plain", tmp_path / "recorded"
    for out, updates in ((plain, False), (recorded, True)):
        cfg = write_config(tmp_path / f"{out.name}.yaml",
                           small_config(out, checkpoint={"updates": updates}))
        assert main(["run", str(cfg)]) == 0
    metrics_plain, _ = read_metrics(plain)
    metrics_recorded, _ = read_metrics(recorded)
    assert same(metrics_plain["model_sha256"], metrics_recorded["model_sha256"])
    assert np.array_equal(read_global(plain), read_global(recorded))
    assert not (plain / "updates").exists()
    rounds = read_updates(recorded)
    assert sorted(rounds) == [0, 1, 2]
    for t in (0, 1):
        r = rounds[t]
        assert len(r.deltas) == 5               # server.clients_per_round
        total = sum(r.weights.values())
        mean = sum(r.weights[c] * r.deltas[c].astype(np.float64) for c in r.deltas) / total
        assert np.allclose(rounds[t + 1].start, r.start + mean, rtol=0, atol=1e-6)
    last = rounds[2]
    mean = sum(last.weights[c] * last.deltas[c].astype(np.float64) for c in last.deltas) / sum(last.weights.values())
    assert np.allclose(read_global(recorded), last.start + mean, rtol=0, atol=1e-6)


@session_runs.per_n
def recorded_runs(base, n):
    cfg = write_config(base / "c.yaml", small_config(base / "run", checkpoint={"updates": True}))
    return [[str(cfg)]], base / "run"


@pytest.mark.mpi
def test_the_record_is_the_same_at_every_n(request):
    runs = session_runs.result(request, recorded_runs)     # tests/session_runs.py: shared launches
    one, three = read_updates(runs[1]), read_updates(runs[3])
    assert sorted(one) == sorted(three) == [0, 1, 2]
    written = {path.name for path in (runs[3] / "updates").iterdir()}
    assert written and written <= {"rank-1.h5", "rank-2.h5"}      # the workers' files: rank 0 hosts no client
    for t in one:
        assert np.array_equal(one[t].start, three[t].start)
        assert sorted(one[t].deltas) == sorted(three[t].deltas) and len(one[t].deltas) == 5
        assert one[t].weights == three[t].weights
        for cid in one[t].deltas:
            assert np.array_equal(one[t].deltas[cid], three[t].deltas[cid])


def test_a_resumed_run_records_what_an_uninterrupted_one_does(tmp_path):
    """Stopped after 2 of 4 rounds, with a cut-short round 2 left in its file (a killed run's), then resumed:
    the record equals the uninterrupted run's, the stale round replaced."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for out in (whole, resumed):
        write_config(tmp_path / f"{out.name}.yaml", small_config(out, rounds=4, checkpoint={"updates": True}))
    assert main(["run", str(tmp_path / "whole.yaml")]) == 0
    assert main(["run", str(tmp_path / "resumed.yaml"), "rounds=2"]) == 0
    with h5py.File(rank_file(resumed, 0), "a") as f:
        f.create_group("round_2").create_dataset("client_99", data=np.ones(3, np.float32))
    assert main(["run", str(tmp_path / "resumed.yaml"), "--resume"]) == 0
    a, b = read_updates(whole), read_updates(resumed)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]
    for t in a:
        assert np.array_equal(a[t].start, b[t].start) and a[t].weights == b[t].weights
        assert all(np.array_equal(a[t].deltas[c], b[t].deltas[c]) for c in a[t].deltas)
