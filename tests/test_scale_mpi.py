"""Issue 14 under mpiexec: failures while sharing the node's data set, and a rank out of memory.

The node layouts themselves (pretend and MPI's own nodes: device and thread choice, the node-shared data
set, -n invariance and resume with client state spilled to disk) are tests/test_nodes_mpi.py's, in the
launches it shares with other files."""

from __future__ import annotations

import pytest
from conftest import read_metrics, run_fedmpi, write_config

pytestmark = pytest.mark.mpi

ROUNDS, HALF = 6, 3


def scale_config(out, **sections):
    """SCAFFOLD on 60 synthetic users, client state bounded to 5 kB per rank (two of its 2.4 kB controls in
    memory, the rest in the rank's spill file), evaluated every other round."""
    cfg = {"seed": 5, "rounds": ROUNDS, "out": str(out), "data": {"name": "synthetic"},
           "partition": {"clients": 60, "scheme": "natural", "samples_per_client": 12},
           "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 6}, "server": {"clients_per_round": 10},
           "algorithm": {"name": "scaffold"}, "eval": {"every": 2}, "checkpoint": {"every": HALF},
           "runtime": {"threads": 1, "progress": "off", "client_state_memory": "5kB"}}
    cfg.update(sections)
    return cfg


def test_a_rank_out_of_memory_marks_the_run_failed_naming_it(tmp_path):
    out = tmp_path / "oom"
    cfg = write_config(tmp_path / "c.yaml", scale_config(out, checkpoint={"every": 0}))
    proc = run_fedmpi(3, "run", cfg, env={"FEDMPI_INJECT_FAULT": "2:1:memory"}, check=False, timeout=120)
    assert proc.returncode == 1
    assert "fedmpi: rank 2 ran out of memory (MemoryError: injected" in proc.stderr
    metrics, attrs = read_metrics(out)
    assert attrs["status"] == "failed" and attrs["error"].startswith("rank 2 ran out of memory")
    assert "peak resident memory" in attrs["error"] and len(metrics["round"]) == 1


def test_a_missing_data_file_fails_every_rank_of_the_node_with_one_message(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", scale_config(tmp_path / "out", data={"name": "emnist",
                       "root": str(tmp_path / "nothing"), "split": "byclass"}, partition={"clients": 6,
                       "scheme": "iid"}, server={"clients_per_round": 2}))
    proc = run_fedmpi(3, "run", cfg, check=False, env={"FEDMPI_TEST_NODES": "2"}, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fedmpi:")]
    assert len(lines) == 1 and "emnist-byclass-train-images-idx3-ubyte" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "out" / "run.h5").exists()
