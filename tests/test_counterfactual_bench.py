"""bench/counterfactual_launch.py smoked at its --quick size: both arms (one packed launch, one launch per
counterfactual) finish, give every counterfactual the same models (the benchmark itself fails otherwise) and the
table is printed. No timing assertions: the figures are the benchmark's output (docs/results/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import MPI_TIMEOUT_S, ROOT


@pytest.mark.mpi
def test_the_quick_benchmark_runs_both_arms_with_the_same_models(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "counterfactual_launch.py"), "--quick", "--np", "2",
                           "--out", str(tmp_path / "bench"), "--json", str(tmp_path / "b.json")],
                          capture_output=True, text=True, cwd=ROOT, timeout=4 * MPI_TIMEOUT_S,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["clients"] == 2 and len(result["ratios"]) == 1 and result["ratios"][0] > 0
    assert "every counterfactual's models identical in both arms" in proc.stdout
    packed = sorted(n for n in os.listdir(tmp_path / "bench" / "packed-0" / "runs") if not n.startswith("."))
    assert packed == ["counterfactuals.yaml", "drop-0", "drop-1", "index.csv", "original.yaml"]
