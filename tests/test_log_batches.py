"""Run-log rows written in batches (`RunLog.append_rows`, `runtime.log_flush_s`) are the same file contents as
the rows written one by one: every /metrics, /clients and /timing dataset, its shape, values and attributes,
with a new metric appearing mid-batch, a string and a [round, k] metric, client rows that widen, a round
without per-client figures and rows without timing."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from test_scale import dense_rows, synthetic_cfg

from fedmpi.io.store import LogRow, RunLog


def _rows(num_clients):
    timing = lambda t: np.arange(12, dtype=float).reshape(2, 6) + t      # noqa: E731 - [rank, phase]
    rows = []
    for t in range(7):
        metrics = {"round": t, "train_loss": 1.0 / (t + 1), "model_sha256": f"{t:064x}"}
        if t >= 2:
            metrics["class_acc"] = np.full(3, 0.1 * t)      # a [round, k] figure from round 2 on
        if t == 4:
            metrics["test_acc"] = 0.5                       # a core figure measured in one round only
        if t >= 5:
            metrics["late_figure"] = float(t)               # a new name in a later round
        clients = dense_rows(num_clients, list(range(t % 3, 2 + t)))        # rows widen from 2 to 7 clients
        if t == 3:
            clients = {}                                    # a round without per-client figures
        rows.append(LogRow(metrics, clients, timing(t) if t not in (1, 6) else None))     # the last without
    return rows


def _contents(path):
    out = {}
    with h5py.File(path, "r") as f:
        for group in ("metrics", "clients", "timing"):
            for name, ds in f[group].items():
                out[f"{group}/{name}"] = (ds.shape, ds.dtype.str, ds[()], dict(ds.attrs))
            out[f"{group}@"] = dict(f[group].attrs)
    return out


@pytest.mark.parametrize("batches", [[7], [3, 4], [1, 5, 1], [2, 2, 2, 1]])
def test_rows_in_batches_equal_rows_one_by_one(tmp_path, batches):
    rows = _rows(20)
    one = RunLog.create(str(tmp_path / "one.h5"), synthetic_cfg(), 2, ["host"], {})
    for row in rows:
        one.append(row.metrics, row.clients, num_clients=20, timing=row.timing)
    one.close()
    batched = RunLog.create(str(tmp_path / "batched.h5"), synthetic_cfg(), 2, ["host"], {})
    start = 0
    for size in batches:
        batched.append_rows(rows[start:start + size], num_clients=20)
        start += size
    batched.close()
    a, b = _contents(tmp_path / "one.h5"), _contents(tmp_path / "batched.h5")
    assert a.keys() == b.keys()
    for key in a:
        if key.endswith("@"):
            assert a[key] == b[key], key
            continue
        (shape_a, dtype_a, values_a, attrs_a), (shape_b, dtype_b, values_b, attrs_b) = a[key], b[key]
        assert (shape_a, dtype_a) == (shape_b, dtype_b), key
        assert np.array_equal(values_a, values_b, equal_nan=values_a.dtype.kind == "f"), key
        assert attrs_a.keys() == attrs_b.keys(), key
    assert a["metrics/round"][2].tolist() == list(range(7))
    assert np.isnan(a["timing/train"][2][1]).all() and a["timing/train"][2][2].tolist() == [2.0, 8.0]
    assert a["timing/train"][0] == (6, 2)        # the last row had no timing: /timing ends a row earlier
    assert np.isnan(a["metrics/late_figure"][2][:5]).all() and a["metrics/late_figure"][2][6] == 6.0


def test_a_row_is_written_after_the_next_broadcast_never_before_it():
    """DeferredRows: `add` (between rounds, before the next broadcast the workers wait for) only queues the
    row; `seal` (right after the broadcast) fingerprints it and writes the batch once its oldest row has
    waited `flush_s`; `flush` writes everything."""
    from types import SimpleNamespace

    from fedmpi.run.rows import DeferredRows

    class Log:
        def __init__(self):
            self.writes = []

        def append_rows(self, rows, num_clients):
            self.writes.append([r.metrics["round"] for r in rows])

    def record(t):
        return SimpleNamespace(metrics={"round": t}, clients={}, timing=None, model=np.full(4, t, np.float32))

    log = Log()
    rows = DeferredRows(log, None, 2, flush_s=0.0)      # every sealed row due at once
    rows.add(0, record(0), 1.0)
    assert log.writes == []                 # round 0's row waits for round 1's broadcast
    rows.seal()
    assert log.writes == [[0]]
    rows.add(1, record(1), 1.0)
    rows.add(2, record(2), 1.0)             # no broadcast sealed round 1's row: sealed here, still not written
    assert log.writes == [[0]]
    rows.flush()
    assert log.writes == [[0], [1, 2]]
    slow = DeferredRows(log := Log(), None, 2, flush_s=3600.0)
    slow.add(0, record(0), 1.0)
    slow.seal()
    slow.add(1, record(1), 1.0)
    slow.seal()
    assert log.writes == []                 # not due yet
    slow.flush()
    assert log.writes == [[0, 1]]
