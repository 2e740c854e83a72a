"""Issue 14 under mpiexec: pretend nodes (FEDMPI_TEST_NODES), the node-shared data set, -n invariance and
resume with client state spilled to disk, failures while sharing, and a rank out of memory.

Launches are the cost here, so runs are batched: one -n 3 launch on two pretend nodes runs the whole run,
its first half and the --resume, then the same whole run on one node (FEDMPI_TEST_NODES set per run);
one -n 1 launch runs it once more."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import ROOT, mpiexec, read_global, read_metrics, run_fedmpi, run_steps_env, write_config

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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("scale")
    paths = {}
    for name, cfg in {"nodes2": scale_config(base / "nodes2"), "half": scale_config(base / "half", rounds=HALF),
                      "node1": scale_config(base / "node1"), "n1": scale_config(base / "n1")}.items():
        paths[name] = (write_config(base / f"{name}.yaml", cfg), base / name)
    # One -n 3 launch for both layouts: each `fedmpi run` makes its own communicator, which reads
    # FEDMPI_TEST_NODES when it splits the ranks into nodes, so the driver sets it per run.
    two, one = {"FEDMPI_TEST_NODES": "2"}, {"FEDMPI_TEST_NODES": None}
    run_steps_env(3, [(two, [paths["nodes2"][0], "--overwrite"]), (two, [paths["half"][0], "--overwrite"]),
                      (two, [paths["half"][0], "--resume", f"rounds={ROUNDS}"]),
                      (one, [paths["node1"][0], "--overwrite"])])
    run_fedmpi(1, "run", paths["n1"][0], "--overwrite")
    return {name: out for name, (_, out) in paths.items()}


def test_the_same_models_on_pretend_nodes_one_node_and_one_rank(runs):
    reference, _ = read_metrics(runs["n1"])
    for name in ("nodes2", "node1"):
        metrics, attrs = read_metrics(runs[name])
        assert attrs["status"] == "finished" and attrs["world_size"] == 3
        assert list(metrics["model_sha256"]) == list(reference["model_sha256"]), name
        assert np.array_equal(metrics["test_acc"], reference["test_acc"], equal_nan=True), name
        assert np.array_equal(read_global(runs[name]), read_global(runs["n1"])), name


def test_resume_with_spilled_client_state_is_bit_identical(runs):
    whole, _ = read_metrics(runs["nodes2"])
    resumed, attrs = read_metrics(runs["half"])
    assert attrs["status"] == "finished" and "from round 3" in attrs["resumes"]
    assert list(resumed["model_sha256"]) == list(whole["model_sha256"])
    assert np.array_equal(read_global(runs["half"]), read_global(runs["nodes2"]))
    # The checkpoint holds the controls of every client that trained (in memory or spilled alike).
    with h5py.File(runs["half"] / "ckpt" / f"ckpt-{HALF}.h5", "r", locking=False) as f:
        assert len(f["clients"]) >= 20 and all("c_i" in f["clients"][c] for c in f["clients"])


def test_pretend_nodes_choose_devices_threads_and_share_data_per_node(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", scale_config(tmp_path / "out"))
    script = ROOT / "tests" / "mpi_scripts" / "node_sharing.py"
    # Both layouts in one launch, each with its own communicator (the script sets FEDMPI_TEST_NODES).
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, str(script), str(cfg),
                           *(f"{nodes}:{tmp_path / nodes}" for nodes in ("1", "2"))],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {nodes: [json.loads((tmp_path / f"{nodes}-{r}.json").read_text()) for r in range(3)] for nodes in "12"}
    one, two = seen["1"], seen["2"]
    cores = len(os.sched_getaffinity(0))
    assert [(r["node"], r["local_rank"], r["local_size"]) for r in one] == [(0, 0, 3), (0, 1, 3), (0, 2, 3)]
    assert [(r["node"], r["local_rank"], r["local_size"]) for r in two] == [(0, 0, 2), (0, 1, 2), (1, 0, 1)]
    assert [r["nodes"] for r in two] == [2, 2, 2] and [r["server_here"] for r in two] == [True, True, False]
    # Device: node-local rank mod the node's 3 GPUs; threads: the node's cores over its ranks.
    assert [r["set_device"] for r in one] == [[0], [1], [2]] and [r["set_device"] for r in two] == [[0], [1], [0]]
    assert [r["device"] for r in two] == ["cuda:0", "cuda:1", "cuda:0"]
    assert [r["cores"] for r in one] == [cores] * 3
    assert [r["cores"] for r in two] == [max(1, cores * 2 // 3)] * 2 + [max(1, cores // 3)]
    assert [r["threads"] for r in two] == [max(1, c // s) for c, s in ((r["cores"], r["local_size"]) for r in two)]
    # One window per node, each rank filling its share: node 0's ranks wrote rows 0..5 and 6..11, rank 2
    # (alone on node 1) all twelve; every rank sees its whole node's window.
    assert [r["written"] for r in two] == [[0, 6], [6, 12], [0, 12]]
    assert two[0]["marks"] == two[1]["marks"] == [0] * 6 + [1] * 6 and two[2]["marks"] == [100] * 12
    assert one[0]["marks"] == one[2]["marks"] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(r["data_equal"] and r["read_only"] for r in one + two)


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
