"""The job scripts in jobs/: syntax, shellcheck, and what they launch, run against stand-in commands.

Each test puts small executables named srun, scontrol, sbatch, mpiexec, fedmpi, nvidia-smi and nproc
first on PATH; they record their arguments (one call per line, fields separated by \\x1f) and exit with
a chosen status, so a script's command line, its resume decision and its requeue on exit 75 can be
checked without SLURM or MPI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "jobs"
SCRIPTS = sorted(JOBS.glob("*.sh")) + sorted(JOBS.glob("*.sbatch"))
CONFIG = "jobs/configs/quickstart.yaml"
SEP = "\x1f"

RECORDER = f"""#!/bin/bash
printf '%s{SEP}' "$(basename "$0")" "$@" >> "$RECORD"
echo >> "$RECORD"
"""
STAND_INS = {
    # srun: records, copies the hostfile it was given, optionally waits for SIGUSR1 like fedmpi would.
    "srun": RECORDER + f"""if [[ -n ${{SLURM_HOSTFILE:-}} ]]; then
    printf 'hostfile{SEP}%s\\n' "$(paste -sd, "$SLURM_HOSTFILE")" >> "$RECORD"
fi
if [[ -n ${{WAIT_FOR_USR1:-}} ]]; then
    trap 'echo "srun got USR1" >> "$RECORD"; exit 75' USR1
    echo started > "$RECORD.started"
    for _ in $(seq 300); do sleep 0.1; done
    exit 3
fi
exit "${{SRUN_EXIT:-0}}"
""",
    "scontrol": RECORDER + """if [[ $1 == show && $2 == hostnames ]]; then
    for host in ${FAKE_HOSTS:-node1}; do echo "$host"; done
fi
exit "${SCONTROL_EXIT:-0}"
""",
    "mpiexec": RECORDER + 'exit "${MPIEXEC_EXIT:-0}"\n',
    "sbatch": RECORDER,
    "fedmpi": RECORDER,
    "nproc": '#!/bin/bash\necho "${FAKE_CORES:-4}"\n',
    "nvidia-smi": """#!/bin/bash
for ((i = 0; i < ${FAKE_GPUS:-0}; i++)); do echo "GPU $i: Stand-in GPU (UUID: GPU-$i)"; done
""",
}


@pytest.fixture
def bench(tmp_path):
    """(env, record path): stand-ins first on PATH, no SLURM or CUDA variables from the outside."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STAND_INS.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "CUDA_", "NP", "OUT", "CONFIG", "OVERRIDES", "GRID", "SEEDS", "FEDMPI",
                                "MPIEXEC", "LAUNCHER", "SRUN_", "SWEEP_DIR", "MAX_"))}
    record = tmp_path / "calls.txt"
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", RECORD=str(record), TMPDIR=str(tmp_path))
    return env, record


def run(script, *args, env, cwd=ROOT, **extra_env):
    return subprocess.run(["bash", str(JOBS / script), *map(str, args)], env={**env, **extra_env}, cwd=cwd,
                          capture_output=True, text=True, timeout=240)     # a hang guard, generous under load


def calls(record, name=None):
    """Recorded calls as argument lists (the command's name first), optionally only those of `name`."""
    if not Path(record).exists():
        return []
    out = [line.rstrip("\n").rstrip(SEP).split(SEP) for line in Path(record).read_text().splitlines() if line]
    return [c for c in out if name is None or c[0] == name]


def slurm_env(**more):
    return {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "fedmpi", "SLURM_NTASKS": "9", "SLURM_CPUS_PER_TASK": "2",
            **more}


# --- syntax --------------------------------------------------------------------------------------------

def test_every_job_script_is_there_and_executable():
    names = {p.name for p in SCRIPTS}
    assert {"workstation.sh", "slurm_cpu.sbatch", "slurm_gpu.sbatch", "slurm_sweep.sbatch",
            "slurm_preemptible.sbatch"} <= names
    assert all(os.access(p, os.X_OK) for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    head = script.read_text().splitlines()
    assert head[0].startswith("#!") and "set -euo pipefail" in head


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


# --- workstation ---------------------------------------------------------------------------------------

def test_workstation_runs_one_rank_per_gpu_plus_the_server(bench):
    env, record = bench
    proc = run("workstation.sh", CONFIG, "rounds=5", "--resume", env=env, FAKE_GPUS="2", OVERRIDES="seed=3")
    assert proc.returncode == 0, proc.stderr
    assert calls(record, "mpiexec") == [["mpiexec", "-n", "3", "fedmpi", "run", CONFIG, "rounds=5", "--resume",
                                         "seed=3"]]


def test_workstation_counts_cuda_visible_devices_first(bench):
    env, record = bench
    run("workstation.sh", CONFIG, env=env, FAKE_GPUS="8", CUDA_VISIBLE_DEVICES="0,1,2")
    assert calls(record, "mpiexec")[0][1:3] == ["-n", "4"]


@pytest.mark.parametrize("cores, extra, ranks", [("2", {}, "3"), ("64", {}, "9"), ("64", {"MAX_WORKERS": "16"}, "17"),
                                                  ("64", {"NP": "5"}, "5")])
def test_workstation_on_cpus_uses_the_cores_capped(bench, cores, extra, ranks):
    env, record = bench
    proc = run("workstation.sh", CONFIG, env=env, FAKE_CORES=cores, CUDA_VISIBLE_DEVICES="", **extra)
    assert proc.returncode == 0, proc.stderr
    assert calls(record, "mpiexec")[0][:3] == ["mpiexec", "-n", ranks]


def test_workstation_takes_launcher_and_fedmpi_from_the_environment(bench):
    env, record = bench
    run("workstation.sh", CONFIG, env=env, NP="2", MPIEXEC="srun", MPIEXEC_ARGS="--exclusive",
        FEDMPI="fedmpi --flag")
    assert calls(record) == [["srun", "-n", "2", "--exclusive", "fedmpi", "--flag", "run", CONFIG]]


def test_workstation_without_a_config_explains_and_exits_2(bench):
    env, record = bench
    proc = run("workstation.sh", env=env)
    assert proc.returncode == 2 and "usage" in proc.stderr and calls(record) == []


# --- SLURM, one node -----------------------------------------------------------------------------------

def test_slurm_cpu_launches_every_task_through_srun(bench):
    env, record = bench
    proc = run("slurm_cpu.sbatch", CONFIG, "rounds=5", env=env, **slurm_env())
    assert proc.returncode == 0, proc.stderr
    assert calls(record) == [["srun", "--mpi=pmi2", "--ntasks=9", "--cpus-per-task=2", "fedmpi", "run", CONFIG,
                              "rounds=5", "out=runs/fedmpi-4242"]]


def test_slurm_cpu_reads_config_overrides_and_out_from_the_environment(bench):
    env, record = bench
    proc = run("slurm_cpu.sbatch", "seed=1", env=env, CONFIG=CONFIG, OVERRIDES="rounds=7 algorithm.name=fsl",
               OUT="runs/mine", NP="5", SRUN_MPI="pmix", SRUN_ARGS="--exclusive", **slurm_env())
    assert proc.returncode == 0, proc.stderr
    assert calls(record) == [["srun", "--mpi=pmix", "--ntasks=5", "--cpus-per-task=2", "--exclusive", "fedmpi", "run",
                              CONFIG, "seed=1", "rounds=7", "algorithm.name=fsl", "out=runs/mine"]]


def test_slurm_cpu_takes_out_from_an_override_and_can_use_mpiexec(bench):
    env, record = bench
    run("slurm_cpu.sbatch", CONFIG, "out=runs/x", env=env, LAUNCHER="mpiexec", **slurm_env())
    assert calls(record) == [["mpiexec", "-n", "9", "fedmpi", "run", CONFIG, "out=runs/x"]]


def test_slurm_cpu_refuses_without_config_or_fedmpi(bench):
    env, record = bench
    assert run("slurm_cpu.sbatch", env=env, **slurm_env()).returncode == 2
    proc = run("slurm_cpu.sbatch", CONFIG, env=env, FEDMPI="no-such-fedmpi", **slurm_env())
    assert proc.returncode == 2 and "no-such-fedmpi" in proc.stderr
    assert calls(record, "srun") == []


def test_slurm_cpu_passes_on_the_exit_status(bench):
    env, _ = bench
    assert run("slurm_cpu.sbatch", CONFIG, env=env, SRUN_EXIT="75", **slurm_env()).returncode == 75


# --- SLURM, GPU nodes ----------------------------------------------------------------------------------

def test_slurm_gpu_places_the_server_and_one_rank_per_gpu(bench):
    env, record = bench
    proc = run("slurm_gpu.sbatch", CONFIG, env=env, FAKE_HOSTS="gpu1 gpu2 gpu3",
               **slurm_env(SLURM_JOB_NODELIST="gpu[1-3]", SLURM_GPUS_PER_NODE="a100:4", SLURM_JOB_NUM_NODES="3"))
    assert proc.returncode == 0, proc.stderr
    assert calls(record, "scontrol") == [["scontrol", "show", "hostnames", "gpu[1-3]"]]
    assert calls(record, "srun") == [["srun", "--mpi=pmi2", "--cpus-per-task=2", "--distribution=arbitrary",
                                      "--ntasks=13", "fedmpi", "run", CONFIG, "out=runs/fedmpi-4242"]]
    hosts = calls(record, "hostfile")[0][1].split(",")
    assert hosts == ["gpu1"] * 5 + ["gpu2"] * 4 + ["gpu3"] * 4


def test_slurm_gpu_with_np_skips_the_placement(bench):
    env, record = bench
    run("slurm_gpu.sbatch", CONFIG, env=env, NP="3", GPUS_PER_NODE="2", **slurm_env(SLURM_JOB_NODELIST="n1"))
    assert calls(record) == [["srun", "--mpi=pmi2", "--cpus-per-task=2", "--ntasks=3", "fedmpi", "run", CONFIG,
                              "out=runs/fedmpi-4242"]]


def test_slurm_gpu_without_a_gpu_count_exits_2(bench):
    env, record = bench
    proc = run("slurm_gpu.sbatch", CONFIG, env=env, **slurm_env(SLURM_JOB_NODELIST="n1"))
    assert proc.returncode == 2 and "GPUS_PER_NODE" in proc.stderr and calls(record, "srun") == []


# --- SLURM job array -----------------------------------------------------------------------------------

GRID = ["--grid", "algorithm.gamma=0.5,1,2", "--seeds", "0,1,2"]


def test_slurm_sweep_maps_the_task_to_its_value_and_seed(bench, tmp_path):
    env, record = bench
    sweep = tmp_path / "sweep"
    proc = run("slurm_sweep.sbatch", "jobs/configs/fsl/cifar10_s1.yaml", "rounds=3", *GRID, env=env,
               SWEEP_DIR=str(sweep), **slurm_env(SLURM_ARRAY_TASK_ID="5", SLURM_ARRAY_JOB_ID="77"))
    assert proc.returncode == 0, proc.stderr
    out = f"out={sweep}/algorithm.gamma-1_seed-2"
    assert calls(record) == [["srun", "--mpi=pmi2", "--ntasks=9", "--cpus-per-task=2", "fedmpi", "run",
                              "jobs/configs/fsl/cifar10_s1.yaml", "rounds=3", "algorithm.gamma=1", "seed=2", out]]
    table = [line for line in proc.stdout.splitlines() if line.startswith("task ")]
    assert len(table) == 9 and "algorithm.gamma=1 seed=2" in table[5]
    assert "this is task 5: algorithm.gamma=1 seed=2" in proc.stdout


def test_slurm_sweep_grid_from_the_environment_covers_every_combination(bench):
    env, record = bench
    proc = run("slurm_sweep.sbatch", "--plan", CONFIG, env=env, GRID="partition.beta=0.1,0.5 algorithm.delta=1,3,5",
               SEEDS="0 1")
    assert proc.returncode == 0, proc.stderr
    points = [line.split(":", 1)[1].split("->")[0].split() for line in proc.stdout.splitlines()
              if line.startswith("task ")]
    assert len(points) == 12 and len({tuple(p) for p in points}) == 12
    assert points[0] == ["partition.beta=0.1", "algorithm.delta=1", "seed=0"]
    assert points[11] == ["partition.beta=0.5", "algorithm.delta=5", "seed=1"]
    assert "sbatch --array=0-11" in proc.stdout and calls(record) == []


def test_slurm_sweep_resumes_a_task_with_a_checkpoint(bench, tmp_path):
    env, record = bench
    ckpt = tmp_path / "sweep" / "algorithm.gamma-0.5_seed-0" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt-10.h5").write_bytes(b"")
    run("slurm_sweep.sbatch", CONFIG, *GRID, env=env, SWEEP_DIR=str(tmp_path / "sweep"),
        **slurm_env(SLURM_ARRAY_TASK_ID="0"))
    assert calls(record, "srun")[0][6:8] == [CONFIG, "--resume"]


@pytest.mark.parametrize("task", [None, "9"])
def test_slurm_sweep_refuses_a_task_outside_the_grid(bench, task):
    env, record = bench
    extra = {} if task is None else {"SLURM_ARRAY_TASK_ID": task}
    proc = run("slurm_sweep.sbatch", CONFIG, *GRID, env=env, **slurm_env(**extra))
    assert proc.returncode == 2 and calls(record, "srun") == []


# --- SLURM, preemptible ---------------------------------------------------------------------------------

def preemptible(env, cwd, **more):
    return run("slurm_preemptible.sbatch", CONFIG, "rounds=50", env=env, cwd=cwd, **slurm_env(**more))


def test_preemptible_first_start_runs_without_resume(bench, tmp_path):
    env, record = bench
    proc = preemptible(env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls(record) == [["srun", "--mpi=pmi2", "--ntasks=9", "--cpus-per-task=2", "fedmpi", "run", CONFIG,
                              "rounds=50", "out=runs/fedmpi-4242"]]


def test_preemptible_resumes_when_a_checkpoint_exists(bench, tmp_path):
    env, record = bench
    (tmp_path / "runs" / "fedmpi-4242" / "ckpt").mkdir(parents=True)
    (tmp_path / "runs" / "fedmpi-4242" / "ckpt" / "ckpt-20.h5").write_bytes(b"")
    preemptible(env, tmp_path, SLURM_RESTART_COUNT="1")
    assert calls(record, "srun")[0][5:] == ["run", CONFIG, "--resume", "rounds=50", "out=runs/fedmpi-4242"]


def test_preemptible_restarts_a_run_that_died_before_its_first_checkpoint(bench, tmp_path):
    env, record = bench
    (tmp_path / "runs" / "fedmpi-4242").mkdir(parents=True)
    (tmp_path / "runs" / "fedmpi-4242" / "run.h5").write_bytes(b"")
    preemptible(env, tmp_path, SLURM_RESTART_COUNT="1")
    assert "--overwrite" in calls(record, "srun")[0]


def test_preemptible_requeues_itself_on_exit_75(bench, tmp_path):
    env, record = bench
    proc = preemptible(env, tmp_path, SRUN_EXIT="75")
    assert proc.returncode == 0, proc.stderr
    assert calls(record, "scontrol") == [["scontrol", "requeue", "4242"]]


def test_preemptible_stops_requeueing_after_max_requeues(bench, tmp_path):
    env, record = bench
    proc = preemptible(env, tmp_path, SRUN_EXIT="75", SLURM_RESTART_COUNT="3", MAX_REQUEUES="3")
    assert proc.returncode == 75 and calls(record, "scontrol") == []


def test_preemptible_does_not_requeue_a_failure(bench, tmp_path):
    env, record = bench
    proc = preemptible(env, tmp_path, SRUN_EXIT="1")
    assert proc.returncode == 1 and calls(record, "scontrol") == []


def warned_while_running(script, argument, env, record, cwd):
    """(exit status, stdout) of `script ARGUMENT` sent SIGUSR1 once its stand-in srun is running, as
    `--signal=B:USR1@120` delivers it to the batch shell."""
    proc = subprocess.Popen(["bash", str(JOBS / script), argument], cwd=cwd,
                            env={**env, **slurm_env(WAIT_FOR_USR1="1")}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    started = Path(f"{record}.started")
    deadline = time.monotonic() + 120      # only a guard against a hang: a loaded machine starts bash slowly
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the stand-in srun never started"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return proc.returncode, out


def test_preemptible_forwards_the_warning_signal_and_requeues(bench, tmp_path):
    env, record = bench
    _, out = warned_while_running("slurm_preemptible.sbatch", CONFIG, env, record, tmp_path)
    assert "SIGUSR1 received" in out
    assert ["srun got USR1"] in calls(record)
    assert calls(record, "scontrol") == [["scontrol", "requeue", "4242"]]


# --- a real SLURM cluster (opt-in) -----------------------------------------------------------------------

REAL_SLURM = "FEDMPI_TEST_SLURM"


def test_slurm_gpu_runs_for_real_on_a_cpu_node(tmp_path):
    """jobs/slurm_gpu.sbatch under a real SLURM (sbatch --wait; 1 node, GPUS_PER_NODE=2 on CPUs: 3 tasks by
    its hostfile placement, srun --mpi=pmi2): the run finishes with the models of one process. Opt-in
    (FEDMPI_TEST_SLURM=1, a node with 3 free CPUs): a job costs about a minute, and CI has no SLURM."""
    if os.environ.get(REAL_SLURM) != "1":
        pytest.skip(f"a real SLURM job takes about a minute: set {REAL_SLURM}=1 where sinfo shows an idle node")
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch not found (no SLURM client here)")
    import sys

    import h5py
    import yaml

    cfg = tmp_path / "c.yaml"
    mapping = {"seed": 1, "rounds": 2, "data": {"name": "synthetic"}, "model": {"name": "lr"},
               "partition": {"clients": 12, "scheme": "natural", "samples_per_client": 12},
               "server": {"clients_per_round": 4}, "checkpoint": {"every": 0},
               "runtime": {"threads": 1, "progress": "lines"}}
    cfg.write_text(yaml.safe_dump(mapping))
    env = {**os.environ, "GPUS_PER_NODE": "2", "FEDMPI": f"{sys.executable} -m fedmpi", "OUT": str(tmp_path / "job"),
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["sbatch", "--wait", "--nodes=1", "--gpus-per-node=0", "--ntasks-per-node=3",
                           "--cpus-per-task=1", f"--output={tmp_path / 'job.out'}", "--export=ALL",
                           str(JOBS / "slurm_gpu.sbatch"), str(cfg)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    assert "1 node(s) x 2 GPU(s) + server = 3 ranks" in log
    one = subprocess.run([sys.executable, "-m", "fedmpi", "run", str(cfg), f"out={tmp_path / 'one'}"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=200)
    assert one.returncode == 0, one.stderr[-2000:]
    runs = {}
    for name in ("job", "one"):
        with h5py.File(tmp_path / name / "run.h5", "r", locking=False) as f:
            runs[name] = (f.attrs["status"], int(f.attrs["world_size"]), list(f["metrics/model_sha256"][()]))
    assert runs["job"][:2] == ("finished", 3) and runs["job"][2] == runs["one"][2]
