"""The MOON misconfiguration (issue 11, issue 17 finding 5): `algorithm.name: moon` with a model without a
projection head is a configuration error found by `Algorithm.check` on every rank before anything is written:
exit 2 with one line under mpiexec -n 3, also with --dry-run, and with --overwrite over a finished run its
run.h5 and ckpt/ are left byte for byte as they were.
"""

from __future__ import annotations

import pytest
from conftest import run_fedmpi, small_config, write_config

from fedmpi.cli import main

pytestmark = pytest.mark.mpi

MOON = "algorithm.name=moon"


def snapshot(out):
    """run.h5 and every file under ckpt/ with its bytes (a lock file beside them may come and go)."""
    files = [out / "run.h5", *sorted((out / "ckpt").rglob("*"))]
    return {str(p.relative_to(out)): p.read_bytes() for p in files if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished fedavg run (lr model) with checkpoints, and its config."""
    base = tmp_path_factory.mktemp("moon-check")
    cfg = write_config(base / "run.yaml", small_config(base / "out", rounds=2, checkpoint={"every": 1, "keep": 2}))
    run_fedmpi(1, "run", cfg)
    before = snapshot(base / "out")
    assert "run.h5" in before and {"ckpt/ckpt-1.h5", "ckpt/ckpt-2.h5"} <= set(before)
    return cfg, base / "out", before


def assert_names_the_problem(line):
    assert line.startswith("fedmpi: config error: model.name = 'lr': algorithm.name = 'moon' needs a model with "
                           "a projection head")
    assert "model.projection" in line and "simple_cnn" in line


def test_overwrite_with_moon_on_lr_exits_2_with_one_line_and_touches_nothing(finished):
    cfg, out, before = finished
    proc = run_fedmpi(3, "run", cfg, MOON, "--overwrite", check=False)
    assert proc.returncode == 2, proc.stderr
    # The outcome's lines start with "fedmpi:" (set-up's progress lines about the data come before it)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fedmpi:")]
    assert len(lines) == 1, proc.stderr
    assert_names_the_problem(lines[0])
    assert snapshot(out) == before


def test_dry_run_refuses_it_too(finished, capsys):
    cfg, out, before = finished
    assert main(["run", str(cfg), MOON, "--overwrite", "--dry-run"]) == 2     # as the real start above
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert_names_the_problem(lines[0])
    assert snapshot(out) == before
