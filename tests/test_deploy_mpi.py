"""Deployment realism inside the round loop under mpiexec (issue 15): -n invariance, an inert clock equal to
today's run at -n 3, resume continuing the simulated clock bit for bit, and the comparison report on those
runs. Split from tests/test_deploy_run.py by topic (that file has the in-process cases); the runs are batched,
one mpiexec per -n shared with other files (tests/session_runs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import session_runs
from conftest import (
    read_clients,
    read_global,
    read_metrics,
    same,
    small_config,
    write_config,
)
from test_deploy_run import ALGORITHMS, CLOCK_ONLY, ROUNDS

# -- MPI: -n invariance, today's run at -n 3, resume -------------------------------------------------------

def mpi_configs(base_dir, trace):
    """name -> config mapping of the batched runs (each small: lr model, 4 rounds)."""
    def cfg(name, **sections):
        out = small_config(base_dir / name, rounds=ROUNDS, **sections)
        out["checkpoint"] = {"every": 2, "keep": 10}
        return out

    return {
        "today": cfg("today", algorithm={"name": "scaffold"}),
        "clocked": cfg("clocked", algorithm={"name": "scaffold"}, clients=CLOCK_ONLY),
        "fedavg": cfg("fedavg", server={"clients_per_round": 4, "deadline": 2.5, "over_select": 0.5},
                      clients={"dropout": 0.2, **CLOCK_ONLY},
                      client={"lr": 0.05, "batch_size": 20, "compress": {"name": "topk", "fraction": 0.05,
                                                                          "error_feedback": True}}),
        "scaffold": cfg("scaffold", algorithm={"name": "scaffold"}, clients={"dropout": 0.3, "availability":
                        "bernoulli", "availability_p": 0.7},
                        client={"lr": 0.05, "batch_size": 20, "compress": {"name": "qsgd", "levels": 4}}),
        "fedskip": cfg("fedskip", algorithm={"name": "fedskip", "delta": 3}, server={"clients_per_round": 5,
                       "deadline": 2.6}, clients={"dropout": 0.2, **CLOCK_ONLY}),
        "safl": cfg("safl", algorithm=ALGORITHMS["safl_gated"], clients={"dropout": 0.2, "availability": "trace",
                    "trace": str(trace), "trace_period": 30.0, **CLOCK_ONLY}),
        "fedbuff": cfg("fedbuff", algorithm={"name": "fedbuff", "buffer_size": 3, "concurrency": 6},
                       clients={"dropout": 0.1, **CLOCK_ONLY}),
    }


def write_trace(path):
    # devices 0-3 on for the first half of every 30 s, devices 4-5 for the second half
    path.write_text("client,start,end\n" + "".join(f"{d},0,15\n" for d in range(4))
                    + "".join(f"{d},15,30\n" for d in (4, 5)))
    return path


@session_runs.plan
def deploy_runs(base_dir):
    """Every MPI case of this file, in the launches shared with other files (tests/session_runs.py): at
    -n 3 the batched runs, then each resumed case's whole run, its first half and the --resume; at -n 1 the
    batched runs, then the resumes of copies of the first halves (another -n, a fresh process). Returns
    (the batched runs by -n, the resumed cases' folders)."""
    trace = write_trace(base_dir / "trace.csv")
    runs, steps = {}, {1: [], 3: []}
    for n in (1, 3):
        configs = mpi_configs(base_dir / f"n{n}", trace)
        steps[n] += [["run", write_config(base_dir / f"n{n}-{name}.yaml", c), "--overwrite"]
                     for name, c in configs.items()]
        runs[n] = {name: base_dir / f"n{n}" / name for name in configs}
    resume_dir = base_dir / "resume"
    resume_dir.mkdir()
    configs = mpi_configs(resume_dir, trace)
    dirs = {}
    for name in RESUMED:
        cfg = write_config(resume_dir / f"{name}.yaml", {**configs[name], "rounds": R})
        d = dirs[name] = {k: resume_dir / name / k for k in ("ref", "half", "half_n1")}
        steps[3] += [["run", cfg, f"out={d['ref']}"], ["run", cfg, f"out={d['half']}", f"rounds={HALF}"],
                     ["copy", d["half"], d["half_n1"]], ["run", cfg, f"out={d['half']}", "--resume"]]
        steps[1].append(["run", cfg, f"out={d['half_n1']}", "--resume"])
    return steps, (runs, dirs)


@pytest.fixture(scope="module")
def launches(request):
    return session_runs.result(request, deploy_runs)


@pytest.fixture(scope="module")
def mpi_runs(launches):
    return launches[0]


@pytest.mark.mpi
def test_an_inert_clock_is_todays_run_at_n3(mpi_runs):
    today, clocked = mpi_runs[3]["today"], mpi_runs[3]["clocked"]
    ref, _ = read_metrics(today)
    got, _ = read_metrics(clocked)
    for name in ref:
        if name != "wall_s":
            assert same(got[name], ref[name]), name
    assert np.array_equal(read_global(clocked), read_global(today))
    assert "sim_time_s" in got and "sim_time_s" not in ref


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fedskip", "safl", "fedbuff"])
def test_deployment_runs_do_not_depend_on_n(mpi_runs, name):
    one, _ = read_metrics(mpi_runs[1][name])
    three, attrs = read_metrics(mpi_runs[3][name])
    assert attrs["status"] == "finished" and attrs["world_size"] == 3
    for key in ("sim_time_s", "uploads", "bytes_up", "bytes_down", "returned", "test_acc"):
        if key in one:
            assert np.array_equal(three[key], one[key], equal_nan=True), key
    np.testing.assert_allclose(three["train_loss"], one["train_loss"], rtol=1e-5)
    np.testing.assert_allclose(read_global(mpi_runs[3][name]), read_global(mpi_runs[1][name]), rtol=1e-5, atol=1e-7)
    c1, c3 = read_clients(mpi_runs[1][name]), read_clients(mpi_runs[3][name])
    assert set(c1) == set(c3)
    for column in ("selected", "dropped", "late", "arrived", "staleness", "uploaded"):
        if column in c1:
            assert np.array_equal(c1[column], c3[column], equal_nan=True), column
    assert np.all(np.diff(three["sim_time_s"]) >= 0)


# -- resume: bit-identical at the same -n, the same run at another -n ------------------------------------

R, HALF = 6, 4          # FedSkip (delta 3) checkpoints mid-period; FedBuff with clients in flight
RESUMED = ("fedavg", "fedskip", "safl", "fedbuff")


@pytest.fixture(scope="module")
def resumed(launches):
    return launches[1]


@pytest.mark.mpi
@pytest.mark.parametrize("name", RESUMED)
def test_resume_continues_the_simulated_clock_bit_for_bit(resumed, name):
    from test_resume import assert_same_metrics

    d = resumed[name]
    ref, _ = read_metrics(d["ref"])
    got, attrs = read_metrics(d["half"])
    assert attrs["status"] == "finished" and f"from round {HALF}" in attrs["resumes"]
    assert_same_metrics(got, ref)
    assert np.array_equal(read_global(d["half"]), read_global(d["ref"]))
    other, attrs = read_metrics(d["half_n1"])
    assert attrs["world_size"] == 1
    assert_same_metrics(other, ref, rtol=1e-5)
    assert np.array_equal(other["sim_time_s"], ref["sim_time_s"])
    import h5py

    with h5py.File(d["ref"] / "ckpt" / f"ckpt-{HALF}.h5", "r") as f:
        assert f["participation/sim_time_s"][0] == ref["sim_time_s"][HALF - 1]
        if name == "fedbuff":      # held updates of clients in flight travel as client state
            assert any(k.startswith("pending_v") for c in f["clients"].values() for k in c)
        if name == "fedavg":
            assert any("compress_residual" in c for c in f["clients"].values())


# -- the comparison report and curves against the simulated clock -----------------------------------------

@pytest.mark.mpi
def test_deploy_report_writes_its_section_figure_and_table(tmp_path):
    import shutil
    import subprocess
    import sys

    from conftest import MPI_TIMEOUT_S, ROOT

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(ROOT / "docs" / "results" / "deployment.md", docs / "deployment.md")
    before = (docs / "deployment.md").read_text()
    proc = subprocess.run([sys.executable, "tools/deploy_report.py", "--rounds", "2", "--seeds", "0", "--threads", "1",
                           "--runs", str(tmp_path / "runs"), "--docs", str(docs)], cwd=ROOT,
                          capture_output=True, text=True, timeout=2 * MPI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (docs / "deployment.md").read_text()
    head = before.split("<!-- deploy_report.py: results start -->")[0]
    assert text.startswith(head) and text.count("<!-- deploy_report.py: results start -->") == 1
    assert "`python tools/deploy_report.py --runs runs/deploy --docs docs/results --rounds 2 --seeds 0`" in text
    table = [line for line in text.split(head, 1)[1].splitlines() if line.startswith("| ")]
    assert len(table) == 2 + 7
    for label in ("FedAvg, dense", "top-k", "QSGD", "SAFL", "FedSkip", "Data sharing", "FedBuff"):
        assert sum(label in line for line in table) == 1, label
    assert (docs / "deployment.png").stat().st_size > 10_000 and (docs / "deployment.csv").exists()
    runs = tmp_path / "runs"
    fedbuff, _ = read_metrics(runs / "fedbuff-seed0")
    assert len(fedbuff["round"]) == 4        # twice the others' rounds
    # the simulated clock's curves (tools/curves.py --x sim_time) on these runs
    curves = subprocess.run([sys.executable, "tools/curves.py", str(runs), "--x", "sim_time", "--out",
                             str(tmp_path / "sim.png")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert curves.returncode == 0 and "curves of 7 run(s)" in curves.stdout, curves.stderr
    assert (tmp_path / "sim.png").stat().st_size > 10_000
