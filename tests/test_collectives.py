"""FedAvg's round moves exactly one broadcast and one reduction, with buffer (uppercase) calls only; a
round with evaluation adds one broadcast of the model and one reduction of the evaluation figures."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, mpiexec, small_config, write_config

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("every,per_round", [(10, 1), (1, 2)], ids=["no-eval", "eval"])
def test_fedavg_round_is_one_bcast_and_one_reduce(tmp_path, every, per_round):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out", eval={"every": every}))
    script = ROOT / "tests" / "mpi_scripts" / "count_collectives.py"
    subprocess.run([mpiexec(), "-n", "3", sys.executable, str(script), str(cfg), str(tmp_path / "calls")],
                   check=True, timeout=180, cwd=ROOT, capture_output=True)
    for rank in range(3):
        calls = json.loads((tmp_path / f"calls-{rank}.json").read_text())
        # Per round (2 rounds of a 3-round run): Bcast of the model and Reduce of the sums, each after a
        # sleeping Ibarrier; with evaluation also the model's Bcast and the evaluation's Reduce.
        assert calls.get("Bcast") == 2 * per_round and calls.get("Reduce") == 2 * per_round, calls
        moved = {name for name in calls if name[0].islower()}
        assert not moved, f"pickle-based calls on rank {rank}: {moved}"
        assert set(calls) <= {"Bcast", "Reduce", "Ibarrier"}, calls
