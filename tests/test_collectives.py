"""FedAvg's round moves exactly one broadcast and one reduction, with buffer (uppercase) calls only; a
round with evaluation adds one broadcast of the model and one reduction of the evaluation figures. With
every rank on one node the round's own broadcast and reduction go through node-shared memory
(fedmpi.mpi.node_buffers): MPI then only sees their barriers."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, mpiexec, small_config, write_config

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("node_buffers", ["1", "0"], ids=["node-buffers", "mpi"])
@pytest.mark.parametrize("every,per_round", [(10, 1), (1, 2)], ids=["no-eval", "eval"])
def test_fedavg_round_is_one_bcast_and_one_reduce(tmp_path, every, per_round, node_buffers):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out", eval={"every": every}))
    script = ROOT / "tests" / "mpi_scripts" / "count_collectives.py"
    subprocess.run([mpiexec(), "-n", "3", sys.executable, str(script), str(cfg), str(tmp_path / "calls")],
                   check=True, timeout=180, cwd=ROOT, capture_output=True,
                   env={**os.environ, "FEDMPI_NODE_BUFFERS": node_buffers})
    for rank in range(3):
        calls = json.loads((tmp_path / f"calls-{rank}.json").read_text())
        # Per round (2 rounds of a 3-round run): Bcast of the model and Reduce of the sums, each after a
        # sleeping Ibarrier; with evaluation also the model's Bcast and the evaluation's Reduce. Node buffers
        # leave the barriers and the evaluation's Reduce (its buffer is not a round buffer).
        bcasts, reduces = (2 * per_round, 2 * per_round) if node_buffers == "0" else (0, 2 * (per_round - 1))
        assert calls.get("Bcast", 0) == bcasts and calls.get("Reduce", 0) == reduces, calls
        assert calls.get("Ibarrier") == 4 * per_round, calls
        moved = {name for name in calls if name[0].islower()}
        assert not moved, f"pickle-based calls on rank {rank}: {moved}"
        assert set(calls) <= {"Bcast", "Reduce", "Ibarrier"}, calls
