"""jobs/slurm_grid.sbatch, a whole sweep spec in one allocation, against the stand-in commands of
tests/test_jobs.py (srun, scontrol, fedmpi record their arguments and exit with a chosen status)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_jobs import bench, calls, run, slurm_env, warned_while_running  # noqa: F401 - bench: a fixture

SPEC = "jobs/sweeps/quickstart_grid.yaml"


@pytest.fixture
def stand_ins(bench):  # noqa: F811 - the fixture imported above
    return bench


def grid(env, cwd, *args, **more):
    return run("slurm_grid.sbatch", SPEC, *args, env=env, cwd=cwd, **slurm_env(**more))


def test_the_whole_allocation_runs_one_sweep(stand_ins, tmp_path):
    env, record = stand_ins
    proc = grid(env, tmp_path, "--retry-failed")
    assert proc.returncode == 0, proc.stderr
    assert calls(record) == [["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "--ntasks=9", "--cpus-per-task=2",
                              "fedmpi", "sweep", SPEC, "--retry-failed"]]


def test_it_requeues_itself_on_exit_75_and_not_on_a_failure(stand_ins, tmp_path):
    env, record = stand_ins
    assert grid(env, tmp_path, SRUN_EXIT="75").returncode == 0
    assert calls(record, "scontrol") == [["scontrol", "requeue", "4242"]]
    Path(record).unlink()
    assert grid(env, tmp_path, SRUN_EXIT="1").returncode == 1 and calls(record, "scontrol") == []
    assert grid(env, tmp_path, SRUN_EXIT="75", SLURM_RESTART_COUNT="2", MAX_REQUEUES="2").returncode == 75
    assert calls(record, "scontrol") == []


def test_it_takes_the_spec_and_launcher_from_the_environment(stand_ins, tmp_path):
    env, record = stand_ins
    proc = run("slurm_grid.sbatch", env=env, cwd=tmp_path, SPEC=SPEC, LAUNCHER="mpiexec", NP="5")
    assert proc.returncode == 0, proc.stderr
    assert calls(record) == [["mpiexec", "-n", "5", "fedmpi", "sweep", SPEC]]


def test_without_a_spec_it_explains_and_exits_2(stand_ins, tmp_path):
    env, record = stand_ins
    proc = run("slurm_grid.sbatch", env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "usage: sbatch" in proc.stderr and calls(record) == []


def test_it_forwards_the_warning_signal_and_requeues(stand_ins, tmp_path):
    env, record = stand_ins
    _, out = warned_while_running("slurm_grid.sbatch", SPEC, env, record, tmp_path)
    assert "SIGUSR1 received" in out and ["srun got USR1"] in calls(record)
    assert calls(record, "scontrol") == [["scontrol", "requeue", "4242"]]
