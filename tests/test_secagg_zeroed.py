"""Secure aggregation turns a non-finite update into zeros before masking (the server cannot refuse an update
it never sees). A NaN attack that diverges a clear-text run finished a secure run at 63% accuracy with nothing
in the run file saying so; the zeroed updates are now counted per round (/metrics/secagg_zeroed_updates) and
read back by `fedmpi report` and `fedmpi.analysis.runs()`."""

from __future__ import annotations

import csv

import h5py
import numpy as np
from conftest import small_config, write_config

from fedmpi.analysis import frames
from fedmpi.cli import main

POISON = '''\
import torch

from fedmpi.uploads.base import UploadStage


class NanUpload(UploadStage):
    """Client 0 and client 3 upload NaN (before secure aggregation's stage, order 40)."""
    name, order, reads = "nan_upload", 25, ()
    works_with_secure_aggregation = True

    @classmethod
    def build(cls, setting):
        return cls()

    def client(self, update, view):
        if update.cid in (0, 3):
            update.vector.fill_(float("nan"))
        return update

    def server(self, sums, weight, view):
        return sums, weight, {}
'''
POISONED = (0, 3)


def test_zeroed_non_finite_updates_are_counted_in_the_run_file_and_reported(tmp_path, monkeypatch, capsys):
    (tmp_path / "nan_stage.py").write_text(POISON)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = small_config(tmp_path / "out", rounds=3, data={"name": "synthetic"},
                       partition={"clients": 8, "scheme": "iid"}, server={"clients_per_round": 4,
                                                                          "secure_aggregation": "secagg"},
                       secagg={"bits": 40, "clip": 2.0, "scale": 100000.0},
                       uploads={"stages": ["nan_stage:NanUpload"]})
    assert main(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == 0
    with h5py.File(tmp_path / "out" / "run.h5", "r") as f:
        zeroed = f["metrics/secagg_zeroed_updates"][()]
        ids, selected = f["clients/ids"][()], f["clients/selected"][()]
        assert np.isfinite(f["model/global"][()]).all()
    # exactly the poisoned clients of each round's cohort were zeroed
    expected = (np.isin(ids, POISONED) & (selected == 1)).sum(axis=1)
    np.testing.assert_array_equal(zeroed, expected)
    assert zeroed.sum() > 0
    [api] = frames.runs(str(tmp_path / "out")).to_dict("records")
    assert api["secagg_zeroed_updates"] == zeroed.sum()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "out"), "--csv", str(tmp_path / "t.csv")]) == 0
    assert "secagg_zeroed_updates" in capsys.readouterr().out
    with open(tmp_path / "t.csv", newline="") as fh:
        [row] = list(csv.DictReader(fh))
    assert float(row["secagg_zeroed_updates"]) == zeroed.sum()


def test_a_run_without_non_finite_updates_records_zero(tmp_path):
    cfg = small_config(tmp_path / "out", rounds=2, data={"name": "synthetic"},
                       partition={"clients": 8, "scheme": "iid"}, server={"clients_per_round": 4,
                                                                          "secure_aggregation": "secagg"},
                       secagg={"bits": 40, "clip": 2.0, "scale": 100000.0})
    assert main(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == 0
    with h5py.File(tmp_path / "out" / "run.h5", "r") as f:
        assert np.array_equal(f["metrics/secagg_zeroed_updates"][()], [0.0, 0.0])
