"""Live tracking under mpiexec: rank 0 alone writes the tracker's files, at -n 3 as at -n 1, with run.h5's
values (the phase times of every rank included) and the same results. The runs join the launches shared
with other files (tests/session_runs.py)."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, same, small_config, write_config

ROUNDS = 3


@session_runs.per_n
def _launch(base, n):
    out = base / "tracked"
    cfg = small_config(str(out), rounds=ROUNDS, runtime={"threads": 1, "progress": "lines",
                                                         "trackers": ["tensorboard"]})
    return [[write_config(base / "tracked.yaml", cfg)]], out


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, _launch)


@pytest.mark.mpi
def test_rank_zero_alone_writes_tensorboard_at_any_n_with_the_same_results(runs):
    acc_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                  reason="pip install 'fedmpi[tensorboard]'")
    for n, out in runs.items():
        folders = glob.glob(str(out / "tensorboard" / "*"))
        assert len(folders) == 1 and len(glob.glob(folders[0] + "/events.out.tfevents.*")) == 1, (n, folders)
        acc = acc_mod.EventAccumulator(folders[0], size_guidance={"scalars": 0})
        acc.Reload()
        metrics, _ = read_metrics(out)
        for tag in ("train_loss", "test_acc", "bytes_up"):
            assert [p.value for p in acc.Scalars(tag)] == list(metrics[tag].astype(np.float32)), (n, tag)
        ranks = {t.rsplit("rank", 1)[1] for t in acc.Tags()["scalars"] if t.startswith("timing/train/")}
        assert ranks == {str(r) for r in range(n)}, n
    m1, m3 = read_metrics(runs[1])[0], read_metrics(runs[3])[0]
    assert same(m1["model_sha256"], m3["model_sha256"])
    assert np.array_equal(read_global(runs[1]), read_global(runs[3]))
