"""bench/gpu_check.sh in its dry mode (what CI runs; no GPU here): the same checks as on a GPU, on the CPU
with 2 rounds. Every check of the table must pass: the reference, -n 2 = -n 3, resume and the device-buffer
(CUDA-aware) path, for W1 and W3, in deterministic mode."""

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.mpi


def test_gpu_check_dry_run_passes_every_check(tmp_path):
    proc = subprocess.run([str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for workload in ("W1", "W3"):
        for check in ("reference", "-n 2 = -n 3", "resume", "cuda-aware"):
            pattern = rf"{re.escape(check)}\s+{workload}\s+-n [23]\s+cpu\s+ok\s"
            assert sum(bool(re.match(pattern, line)) for line in lines) == 1, (check, workload, proc.stdout)
    assert "FAIL" not in proc.stdout
    assert "every check passed" in proc.stdout and "dry run on the CPU" in proc.stdout
    # The runs were deterministic-mode runs on the CPU.
    config = (tmp_path / "W1" / "n3" / "config.yaml").read_text()
    assert '"deterministic": true' in config and '"device": "cpu"' in config
