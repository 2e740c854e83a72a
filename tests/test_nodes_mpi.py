"""Ranks on several nodes (issue 28): two nodes of two ranks in MPI's own view where this machine allows it
(conftest.node_launch: MPICH's Hydra with two host names, the fork launcher; else fedmpi's pretend nodes),
checked against the one-node runs and -n 1: node-local device and thread choice, the per-node data copy,
the round's broadcast and reduction through node-shared memory and the node leaders (fedmpi.mpi.hierarchy)
against the flat MPI path (FEDMPI_NODE_BUFFERS=0), checkpoints and resume with client state spilled to disk.

Launches are the cost: the two-node steps are ONE launch (session_runs.nodes(2, 2)); the -n 3 and -n 1 steps
join the launches other files share (tests/session_runs.py). At -n 3 the SCAFFOLD run goes on two
pretend nodes of 2 + 1 ranks (a leader alone on its node), with the pretend layouts' node report (what
tests/test_scale_mpi.py ran in launches of its own before)."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import session_runs
from conftest import ROOT, node_launch, read_global, read_metrics, same, small_config, write_config
from test_scale_mpi import HALF, ROUNDS, scale_config

pytestmark = pytest.mark.mpi

TWO_NODES = session_runs.nodes(2, 2)
SCRIPT = ROOT / "tests" / "mpi_scripts" / "node_sharing.py"
COUNT = ROOT / "tests" / "mpi_scripts" / "count_collectives.py"


# Each protocol's use of the round buffers: whole buffers with evaluation (the model shared again), FedSkip's
# header-only broadcasts and point-to-point slots, gated SAFL's statistics-only reduction and masked gather.
SMALL = {
    "fedavg": {"eval": {"every": 1}},
    "fedskip": {"algorithm": {"name": "fedskip", "delta": 2}, "rounds": 4},
    "safl_gated": {"algorithm": {"name": "safl", "eps": 0.5, "L": 5.0, "gating": True, "nu": 20.0}},
}
FLAT = {"FEDMPI_NODE_BUFFERS": "0"}
PRETEND2 = {"FEDMPI_TEST_NODES": "2"}


@session_runs.plan
def node_runs(base):
    def run(name, cfg, *extra, env=None):
        step = ["run", write_config(base / f"{name}.yaml", cfg), *extra]
        return [env, *step] if env else step

    def scale(name, **sections):
        return scale_config(base / name, **sections)

    def small(name, sections):
        return small_config(base / name, **sections)

    nodes = [run("nodes_scale", scale("nodes_scale"), "--overwrite"),
             run("nodes_half", scale("nodes_half", rounds=HALF), "--overwrite"),
             run("nodes_half", scale("nodes_half", rounds=HALF), "--resume", f"rounds={ROUNDS}")]
    nodes += [run(f"nodes_{k}", small(f"nodes_{k}", v), "--overwrite") for k, v in SMALL.items()]
    nodes.append(run("flat_fedavg", small("flat_fedavg", SMALL["fedavg"]), "--overwrite", env=FLAT))
    cfg = write_config(base / "report.yaml", scale("report"))
    nodes.append(["script", SCRIPT, cfg, f"-:{base / 'real'}"])
    counted = write_config(base / "count.yaml", small("count", {"eval": {"every": 10}}))
    nodes += [[{"FEDMPI_NODE_BUFFERS": setting}, "script", COUNT, counted, base / f"calls{setting}"]
              for setting in ("1", "0")]
    three = [run("pretend_scale", scale("pretend_scale"), "--overwrite", env=PRETEND2),
             ["script", SCRIPT, cfg, f"1:{base / 'p1'}", f"2:{base / 'p2'}"]]
    one = [run("n1_scale", scale("n1_scale"), "--overwrite")]
    one += [run(f"n1_{k}", small(f"n1_{k}", v), "--overwrite") for k, v in SMALL.items()]
    return {TWO_NODES: nodes, 3: three, 1: one}, base


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, node_runs)


def _fingerprints(run):
    metrics, attrs = read_metrics(run)
    assert attrs["status"] == "finished", run
    return list(metrics["model_sha256"]), metrics["test_acc"], read_global(run)


@pytest.mark.parametrize("name", ["scale", *SMALL])
def test_two_nodes_give_the_models_of_one_node_and_one_rank(runs, name):
    """MPI's two nodes (hierarchical round; FedAvg also on the flat MPI path there) and 2 + 1 pretend nodes
    at -n 3 (SCAFFOLD): each the -n 1 run's models, round by round. (One node at -n 3 against -n 1 is
    every other MPI file's check.)"""
    sha, acc, x = _fingerprints(runs / f"n1_{name}")
    others = [f"nodes_{name}"] + {"scale": ["pretend_scale"], "fedavg": ["flat_fedavg"]}.get(name, [])
    for other in others:
        o_sha, o_acc, o_x = _fingerprints(runs / other)
        assert o_sha == sha, other
        assert same(o_acc, acc), other
        assert np.array_equal(o_x, x), other
    assert read_metrics(runs / f"nodes_{name}")[1]["world_size"] == 4


def test_resume_on_two_nodes_with_spilled_client_state_is_bit_identical(runs):
    whole, _ = read_metrics(runs / "nodes_scale")
    resumed, attrs = read_metrics(runs / "nodes_half")
    assert attrs["status"] == "finished" and "from round 3" in attrs["resumes"]
    assert list(resumed["model_sha256"]) == list(whole["model_sha256"])
    assert np.array_equal(read_global(runs / "nodes_half"), read_global(runs / "nodes_scale"))
    # The checkpoint holds the controls of every client that trained (in memory or spilled alike).
    with h5py.File(runs / "nodes_half" / "ckpt" / f"ckpt-{HALF}.h5", "r", locking=False) as f:
        assert len(f["clients"]) >= 20 and all("c_i" in f["clients"][c] for c in f["clients"])


def _reports(runs, prefix, n):
    return [json.loads((runs / f"{prefix}-{r}.json").read_text()) for r in range(n)]


def _cores(ranks):
    """The CPUs that `ranks` bound themselves to (tests/mpi_scripts/node_sharing.py's `bound_cpu`)."""
    cpus = sorted(os.sched_getaffinity(0))
    return len({cpus[r % len(cpus)] for r in ranks})


def test_two_nodes_choose_devices_threads_and_share_data_per_node(runs):
    seen = _reports(runs, "real", 4)
    launch = node_launch(2, 2)
    assert [(r["node"], r["local_rank"], r["local_size"], r["nodes"]) for r in seen] == \
        [(0, 0, 2, 2), (0, 1, 2, 2), (1, 0, 2, 2), (1, 1, 2, 2)], launch
    assert [r["server_here"] for r in seen] == [True, True, False, False]
    # A node's cores are those its ranks may run on (each bound to one here); pretend nodes share their
    # machine's by their ranks.
    if launch.kind == "mpi":
        node_cores = [_cores([0, 1])] * 2 + [_cores([2, 3])] * 2
    else:
        node_cores = [max(1, _cores(range(4)) * 2 // 4)] * 4
    assert [r["cores"] for r in seen] == node_cores
    assert [r["threads"] for r in seen] == [max(1, c // 2) for c in node_cores]
    # Device: node-local rank mod the node's 3 GPUs.
    assert [r["set_device"] for r in seen] == [[0], [1], [0], [1]]
    assert [r["device"] for r in seen] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    # One data window per node, each of its ranks filling its half of the rows.
    assert [r["written"] for r in seen] == [[0, 6], [6, 12]] * 2
    assert seen[0]["marks"] == seen[1]["marks"] == [0] * 6 + [1] * 6
    assert seen[2]["marks"] == seen[3]["marks"] == [100] * 6 + [101] * 6
    assert all(r["data_equal"] and r["read_only"] for r in seen)
    if launch.hostnames:
        assert [r["processor"] for r in seen] == ["fedmpi-node0"] * 2 + ["fedmpi-node1"] * 2
    _round_path(seen, leaders=[2, 0, 2, 0])


def _round_path(seen, leaders):
    """The round buffers' reduction and broadcast through the node leaders: rank 0 gets the exact sums
    (the tiny entries show every rank's term was added once) and every rank rank 0's broadcast prefix; a
    rank on rank 0's node reads rank 0's broadcast slot itself (the whole of it), a rank on another node
    its leader's slot, which received the prefix alone."""
    n = len(seen)
    assert seen[0]["sums"] == [n * (n + 1) / 2, sum(2.0 ** -(40 + r) for r in range(n)), float(n)]
    assert all(r["down"][:4] == [0.0, 1.0, 2.0, 3.0] for r in seen)
    assert all(r["down"][4:] == ([4.0, 5.0] if r["server_here"] else [0.0, 0.0]) for r in seen[1:])
    assert [r["leaders"] for r in seen] == leaders


def test_pretend_nodes_choose_devices_threads_and_share_data_per_node(runs):
    one, two = _reports(runs, "p1", 3), _reports(runs, "p2", 3)
    cores = _cores(range(3))
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
    _round_path(one, leaders=[1, 0, 0])
    _round_path(two, leaders=[2, 0, 2])


def test_two_nodes_move_the_round_by_one_collective_among_the_leaders(runs):
    """FedAvg's two rounds at 2 nodes x 2 ranks: with node buffers, the model's Bcast and the sums' Reduce
    only among the two node leaders (ranks 0 and 2), every rank's world communicator seeing just the
    sleeping barriers; flat, every rank in MPI's Bcast and Reduce."""
    hierarchical = [json.loads((runs / f"calls1-{r}.json").read_text()) for r in range(4)]
    flat = [json.loads((runs / f"calls0-{r}.json").read_text()) for r in range(4)]
    leader = {"Ibarrier": 4, "leaders.Bcast": 2, "leaders.Reduce": 2}
    assert hierarchical == [leader, {"Ibarrier": 4}, leader, {"Ibarrier": 4}]
    assert flat == [{"Ibarrier": 4, "Bcast": 2, "Reduce": 2}] * 4


def test_the_run_file_records_how_it_ran_on_two_nodes(runs):
    """Issue 40: a two-node run used to record `hosts: 'vm'` and nothing of its nodes or its round's path."""
    import importlib.metadata

    import yaml

    _, attrs = read_metrics(runs / "nodes_fedavg")
    assert attrs["nodes"] == 2 and attrs["ranks_per_node"] == "2,2" and attrs["rank_nodes"] == "0,0,1,1"
    assert attrs["round_path"].startswith("hierarchical: node-shared memory within each node, MPI among the 2")
    assert len(attrs["rank_hosts"].split(",")) == 4 and set(attrs["hosts"].split(",")) == \
        set(attrs["rank_hosts"].split(","))
    assert attrs["devices"] == "cpu,cpu,cpu,cpu" and len(attrs["rank_threads"].split(",")) == 4
    assert attrs["mpi_library"] and attrs["mpi_version"].count(".") == 1
    for library in ("python", "torch", "numpy", "h5py", "mpi4py"):
        assert attrs[f"version_{library}"]
    resolved = yaml.safe_load(attrs["resolved"])
    assert resolved["runtime.device"] == ["cpu"] and resolved["runtime.progress"] in ("bar", "lines")
    assert {"runtime.threads", "runtime.kernels", "runtime.client_dealing", "client.vectorize",
            "server.trains_clients"} <= set(resolved)
    assert attrs["fedmpi_version"] == importlib.metadata.version("fedmpi")     # one version, pip's and the file's
    _, flat = read_metrics(runs / "flat_fedavg")
    assert flat["round_path"] == "flat: MPI collectives among all ranks" and flat["nodes"] == 2
    _, one = read_metrics(runs / "n1_fedavg")
    assert one["nodes"] == 1 and one["ranks_per_node"] == "1" and one["world_size"] == 1
