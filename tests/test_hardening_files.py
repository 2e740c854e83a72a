"""Issue 29, findings 1 and 2: nothing that exists is deleted, truncated or replaced before the new run has passed
every check that can fail before training; `--overwrite` moves the old run aside and removes it only once the
new run.h5 exists; no command writes to one of its inputs; no file is written through a planted link.

The one-process cases drive the functions (and `fedmpi export` / `report` through `fedmpi.cli.main`); the
runs are batched into one mpiexec launch per world size (`_launch`), each step's exit code and the bytes
of every file in the runs' folders recorded after it."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import MPI_TIMEOUT_S, ROOT, mpiexec, small_config, write_config
from run_files import write_run
from torch import nn

from fedmpi import config
from fedmpi.cli import main as fedmpi_main
from fedmpi.core.errors import ConfigError
from fedmpi.core.models import build_model, check_takes
from fedmpi.io.outdir import ASIDE_PREFIX, claim_here, replacing
from fedmpi.io.store import RunLog

VICTIM_TEXT = b"precious bytes that fedmpi must never touch\n"


def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM_TEXT)
    return path


def snapshot(folder):
    """{relative path: sha256} of every file under `folder` (links by their target text)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[rel] = "link:" + os.readlink(path)
            else:
                found[rel] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return found


def load_cfg(tmp_path, out):
    return config.load(write_config(tmp_path / "c.yaml", small_config(out)), [])


# --- finding 2: planted links -----------------------------------------------------------------------------

def test_a_link_at_the_lock_file_is_refused_and_its_target_kept(tmp_path):
    out, target = tmp_path / "out", victim(tmp_path)
    out.mkdir()
    os.symlink(target, out / ".fedmpi.lock")
    with pytest.raises(ConfigError, match=r"\.fedmpi\.lock is a symbolic link"):
        claim_here(str(out))
    assert target.read_bytes() == VICTIM_TEXT


def test_a_hard_link_at_the_lock_file_is_refused_and_its_target_kept(tmp_path):
    out, target = tmp_path / "out", victim(tmp_path)
    out.mkdir()
    os.link(target, out / ".fedmpi.lock")
    with pytest.raises(ConfigError, match="a hard link"):
        claim_here(str(out))
    assert target.read_bytes() == VICTIM_TEXT


def test_run_file_temporaries_never_follow_planted_links(tmp_path):
    out, target = tmp_path / "out", victim(tmp_path)
    out.mkdir()
    for name in ("run.h5.tmp", "run.h5.model.tmp"):
        os.symlink(target, out / name)
    log = RunLog.create(str(out / "run.h5"), load_cfg(tmp_path, out), 1, ["host"], {})
    log.write_model(np.arange(5, dtype=np.float32))
    assert target.read_bytes() == VICTIM_TEXT
    assert not os.path.islink(out / "run.h5")
    with h5py_file(out / "run.h5") as f:
        np.testing.assert_array_equal(f["model/global"][()], np.arange(5))
    # Only the planted links are left beside run.h5: no temporary file of fedmpi's stays behind.
    assert sorted(os.listdir(out)) == ["run.h5", "run.h5.model.tmp", "run.h5.tmp"]


def h5py_file(path):
    import h5py

    return h5py.File(path, "r", locking=False)


def test_resume_refuses_a_run_file_that_is_a_link(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere.h5"
    out.mkdir()
    elsewhere.write_bytes(b"not yours")
    os.symlink(elsewhere, out / "run.h5")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        claim_here(str(out), resume=True)


# --- finding 1: --overwrite moves the old run aside ------------------------------------------------------

def old_run(out):
    (out / "ckpt").mkdir(parents=True)
    (out / "ckpt" / "ckpt-2.h5").write_bytes(b"old checkpoint")
    (out / "run.h5").write_bytes(b"old run")
    return snapshot(out)


def test_overwrite_puts_the_old_run_back_when_the_new_run_file_cannot_be_made(tmp_path):
    out = tmp_path / "out"
    before = old_run(out)

    def create():
        assert not (out / "run.h5").exists() and not (out / "ckpt").exists()    # moved aside, not deleted
        assert len(glob.glob(str(out / (ASIDE_PREFIX + "*")))) == 1
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replacing(str(out), True, create)
    assert snapshot(out) == before


def test_overwrite_removes_the_old_run_only_after_the_new_run_file_exists(tmp_path):
    out = tmp_path / "out"
    old_run(out)

    def create():
        (out / "run.h5").write_bytes(b"new run")
        return "made"

    assert replacing(str(out), True, create) == "made"
    assert snapshot(out) == {"run.h5": hashlib.sha256(b"new run").hexdigest()}


def test_a_run_left_aside_by_a_killed_overwrite_is_kept_and_named(tmp_path, capsys):
    out = tmp_path / "out"
    left = out / (ASIDE_PREFIX + "abcd")
    left.mkdir(parents=True)
    (left / "run.h5").write_bytes(b"old run")
    claim_here(str(out)).release()
    assert f"{left} holds a run moved aside" in capsys.readouterr().err
    assert (left / "run.h5").read_bytes() == b"old run"


def test_a_model_that_cannot_take_the_data_is_refused_naming_both():
    cfg = config.Config(data=config.DataConfig(name="synthetic"), model=config.ModelConfig(name="lstm"))
    model = build_model(cfg.model, (60,), 10)
    with pytest.raises(ConfigError, match=r"model.name = 'lstm' cannot take data.name = 'synthetic'"):
        check_takes(model, cfg.model.name, cfg.data.name, np.zeros((4, 60), dtype=np.float32), 10)


def test_the_model_check_changes_nothing_of_the_model():
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = config.Config()
    check_takes(model, cfg.model.name, cfg.data.name, np.full((4, 3), 5.0, dtype=np.float32), 2)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError, match=r"outputs of shape \(1, 2\), not \(1, 7\)"):
        check_takes(model, cfg.model.name, cfg.data.name, np.zeros((4, 3), dtype=np.float32), 7)


# --- finding 1: no command writes to one of its inputs; --csv keeps existing files --------------------------

def export(capsys, *args):
    code = fedmpi_main(["export", *map(str, args)])
    return code, capsys.readouterr().err


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run" / "run.h5", rounds=4)


def test_export_refuses_to_write_over_the_run_it_exports(run, capsys):
    before = run.read_bytes()
    for target in (run, run.parent / "." / "run.h5"):
        code, err = export(capsys, run.parent, "--csv", target, "--force")
        assert code == 2 and "an input of this command" in err, err
    assert run.read_bytes() == before


def test_export_csv_keeps_an_existing_file_unless_force(run, tmp_path, capsys):
    existing = tmp_path / "table.csv"
    existing.write_text("mine\n")
    code, err = export(capsys, run, "--csv", existing)
    assert code == 2 and "already exists" in err and "--force" in err
    assert existing.read_text() == "mine\n"
    code, err = export(capsys, run, "--csv", existing, "--force")
    assert code == 0, err
    assert existing.read_text().startswith("round,")


def test_export_csv_never_writes_through_a_link(run, tmp_path, capsys):
    target, link = victim(tmp_path), tmp_path / "link.csv"
    os.symlink(target, link)
    assert export(capsys, run, "--csv", link)[0] == 2            # exists (a link): kept without --force
    code, err = export(capsys, run, "--csv", link, "--force")
    assert code == 0, err
    assert target.read_bytes() == VICTIM_TEXT                   # the link was replaced, its target kept
    assert not link.is_symlink() and link.read_text().startswith("round,")


def test_report_refuses_to_write_over_a_run_it_reads(run, capsys):
    before = run.read_bytes()
    for option in ("--csv", "--plot"):
        code = fedmpi_main(["report", str(run), option, str(run)])
        assert code == 2 and "an input of this command" in capsys.readouterr().err
    assert run.read_bytes() == before


# --- the same through real runs (one launch per world size) ------------------------------------------------

DRIVER = r"""
import hashlib, json, os, sys
from mpi4py import MPI
from fedmpi.cli import main

def snapshot(folder):
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return found

steps, folders, record = json.loads(sys.argv[1])
results = []
for step in steps:
    if step[0] == "truncate":             # rank 0 damages a file between two runs
        if MPI.COMM_WORLD.rank == 0:
            os.truncate(step[1], int(step[2]))
        MPI.COMM_WORLD.Barrier()
        code = 0
    else:
        code = main(["run", *step])
    MPI.COMM_WORLD.Barrier()
    results.append({"code": code, "files": {f: snapshot(f) for f in folders}})
if MPI.COMM_WORLD.rank == 0:
    json.dump(results, open(record, "w"))
"""


def _launch(n, steps, folders, record):
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-c", DRIVER,
           json.dumps([[[str(a) for a in s] for s in steps], [str(f) for f in folders], str(record)])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=MPI_TIMEOUT_S, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(record.read_text()), proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_refused_runs_leave_the_old_run_byte_identical(tmp_path, n):
    R, P, F = tmp_path / "R", tmp_path / "P", tmp_path / "F"
    cfg = write_config(tmp_path / "c.yaml", small_config(R, rounds=2))
    steps = [[cfg],                                                                       # 0: the old run
             [cfg, "model.name=lstm", "data.name=synthetic", "partition.scheme=natural", "--overwrite"],
             [cfg, "--fork-from", f"{R}@2", "--overwrite"],                              # 2: parent is out
             [cfg, f"out={P}"],                                                           # 3: a parent
             ["truncate", P / "run.h5", 3000],                                            # 4: ... damaged
             [cfg, f"out={F}", "--fork-from", f"{P}@2"],                                  # 5: fork from it
             [cfg, "rounds=1", "--overwrite"]]                                            # 6: a real overwrite
    results, err = _launch(n, steps, [R, F], tmp_path / "record.json")
    codes = [r["code"] for r in results]
    assert codes == [0, 2, 2, 0, 0, 2, 0], err
    old = results[0]["files"][str(R)]
    assert set(old) >= {"run.h5", "ckpt/ckpt-2.h5"}
    for i in (1, 2, 5):
        assert results[i]["files"][str(R)] == old, f"step {i} changed the old run"
    assert "model.name = 'lstm' cannot take data.name = 'synthetic'" in err
    assert "the parent is out" in err
    assert f"{P / 'run.h5'} cannot be read as a run file" in err
    assert results[5]["files"][str(F)] == {}        # the refused fork leaves neither its folder's lock nor a file
    replaced = results[6]["files"][str(R)]
    assert set(replaced) == {".fedmpi.lock", "run.h5", "ckpt/ckpt-1.h5"}        # no aside folder left
    assert replaced["run.h5"] != old["run.h5"]
