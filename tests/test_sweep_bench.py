"""bench/sweep.py (issue 41's benchmark) smoked at its --quick size: the three arms (one sweep, one launch per
experiment, tools/run_batch.py) each finish every experiment of the grid and the table is printed. No timing
assertions: the figures are the benchmark's output (docs/results/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import MPI_TIMEOUT_S, ROOT


@pytest.mark.mpi
def test_the_quick_benchmark_runs_every_arm_and_prints_the_table(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sweep.py"), "--quick", "--np", "2", "--out", str(out),
                           "--json", str(tmp_path / "sweep.json")], capture_output=True, text=True, cwd=ROOT,
                          timeout=4 * MPI_TIMEOUT_S, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "sweep.json").read_text())
    assert result["experiments"] == 2 and result["np"] == 2 and result["rounds"] == 1
    assert {arm: len(records) for arm, records in result["arms"].items()} == {"sweep": 1, "separate": 1, "run_batch": 1}
    assert all(r["wall_s"] > 0 and r["loop_s"] > 0 for records in result["arms"].values() for r in records)
    assert set(result["ratios"]) == {"separate", "run_batch"} and all(v[0] > 0 for v in result["ratios"].values())
    assert "target: sweep at most 0.5 of the separate launches' wall time" in proc.stdout
    assert sorted(os.listdir(out)) == ["run_batch-0", "separate-0", "sweep-0"]
