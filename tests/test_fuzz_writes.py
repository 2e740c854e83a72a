"""Issue 39's property, at generated points: whichever run.h5 row batch or checkpoint write fails (ENOSPC or EIO,
through the FEDMPI_TEST_WRITE_FAIL test aid), the write raises WriteFailed naming the file and the reason, the
rows before it stay complete and readable, the failure can still be recorded, and no temporary file or
broken checkpoint is left. In this process (RunLog and CheckpointWriter directly): fast, so many points."""

from __future__ import annotations

import errno
import os

import h5py
import numpy as np
import pytest
from conftest import small_config
from fuzz_support import examples
from hypothesis import given
from hypothesis import strategies as st

from fedmpi import config
from fedmpi.io import checkpoint, write_errors
from fedmpi.io.disk_room import WriteFailed
from fedmpi.io.store import LogRow, RunLog

CODES = st.sampled_from(["ENOSPC", "EIO"])


@pytest.fixture
def inject(monkeypatch):
    """inject(spec): FEDMPI_TEST_WRITE_FAIL = spec, its counts from zero."""
    def set_spec(spec):
        monkeypatch.setenv(write_errors.FAIL_ENV, spec)
        write_errors._counts.clear()
    yield set_spec
    write_errors._counts.clear()


def reason(code):
    return os.strerror(getattr(errno, code))


@examples(25)
@given(batches=st.lists(st.integers(1, 4), min_size=1, max_size=6), data=st.data(), code=CODES)
def test_a_failed_row_batch_keeps_every_row_before_it(tmp_path_factory, inject, batches, data, code):
    out = tmp_path_factory.mktemp("rows")
    path = str(out / "run.h5")
    nth = data.draw(st.integers(1, len(batches)), label="failing batch")
    log = RunLog.create(path, config.from_dict(small_config(out)), 1, ["h"], {})
    inject(f"rows:{nth}:{code}")
    rows = 0
    for i, size in enumerate(batches, start=1):
        batch = [LogRow({"round": rows + j, "test_acc": 0.5}, {"loss": np.ones(8)}) for j in range(size)]
        if i == nth:
            with pytest.raises(WriteFailed, match=f"^cannot write {path}: {reason(code)}$"):
                log.append_rows(batch, num_clients=8)
            break
        log.append_rows(batch, num_clients=8)
        rows += size
    log.finish("failed", "disk")
    assert write_errors.broken() is None        # the aid fails a write before it touches the file
    with h5py.File(path, "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and f["metrics/round"][()].tolist() == list(range(rows))
        assert all(ds[()].shape[0] == rows for group in ("metrics", "clients") for ds in f[group].values())


@examples(25)
@given(datasets=st.integers(1, 6), data=st.data(), code=CODES)
def test_a_failed_checkpoint_write_leaves_the_previous_checkpoint_alone(tmp_path_factory, inject, datasets, data,
                                                                        code):
    out = tmp_path_factory.mktemp("ckpt")
    cfg = config.from_dict(small_config(out, checkpoint={"every": 1, "keep": 5}))

    def write(round_):
        w = checkpoint.CheckpointWriter(cfg, round_, wall_s=1.0, world_size=1)
        try:
            w.put_server_side({"global": np.arange(10, dtype=np.float32)})
            for cid in range(datasets):
                w.put_client(cid, {"c": np.ones(10, dtype=np.float32)})
            return w.commit(cfg.checkpoint.keep)
        except BaseException:
            w.discard()
            raise

    kind = data.draw(st.sampled_from(["checkpoint", "commit"]), label="kind")
    nth = data.draw(st.integers(1, datasets + 1), label="dataset") if kind == "checkpoint" else 1
    inject("")
    first = write(1)
    inject(f"{kind}:{nth}:{code}")
    with pytest.raises(WriteFailed, match=f"^cannot write {checkpoint.ckpt_path(str(out), 2)}: {reason(code)}$"):
        write(2)
    assert sorted(os.listdir(out / "ckpt")) == ["ckpt-1.h5"]
    checkpoint.verify(first)
    assert write_errors.broken() is None
