"""FedAvg's round moves exactly one broadcast and one reduction, with buffer (uppercase) calls only."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, mpiexec, small_config, write_config

pytestmark = pytest.mark.mpi


def test_fedavg_round_is_one_bcast_and_one_reduce(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    script = ROOT / "tests" / "mpi_scripts" / "count_collectives.py"
    subprocess.run([mpiexec(), "-n", "3", sys.executable, str(script), str(cfg), str(tmp_path / "calls")],
                   check=True, timeout=180, cwd=ROOT, capture_output=True)
    for rank in range(3):
        calls = json.loads((tmp_path / f"calls-{rank}.json").read_text())
        # Per round: Bcast of the model and Reduce of the sums, each after a sleeping Ibarrier.
        assert calls.get("Bcast") == 2 and calls.get("Reduce") == 2, calls
        moved = {name for name in calls if name[0].islower()}
        assert not moved, f"pickle-based calls on rank {rank}: {moved}"
        assert set(calls) <= {"Bcast", "Reduce", "Ibarrier"}, calls
