"""How a run ends when it is interrupted, fails, diverges or is signalled after its work (issue 17, findings
6, 9, 10 and 13): one line, the right exit status on every rank, the right status in run.h5, no traceback,
and nothing lost that was finished."""

import glob
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from conftest import ROOT, fedmpi_cmd, run_fedmpi, small_config, write_config

import fedmpi
from fedmpi.core.errors import EXIT_INTERRUPTED
from fedmpi.mpi import signals


def rank_pids(cfg):
    """{rank: pid} of the fedmpi processes running `cfg` (their launcher puts PMI_RANK in the environment)."""
    found = {}
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            cmdline = open(f"{proc}/cmdline", "rb").read()
            environ = open(f"{proc}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if str(cfg).encode() in cmdline and b"fedmpi" in cmdline:
            for item in environ:
                if item.startswith(b"PMI_RANK="):
                    found[int(item.split(b"=", 1)[1])] = int(proc.rsplit("/", 1)[1])
    return found


def rows(out):
    try:
        with h5py.File(out / "run.h5", "r", locking=False) as f:
            return f["metrics/round"].shape[0]
    except (OSError, KeyError):
        return 0


@pytest.mark.mpi
@pytest.mark.parametrize("target", ["worker", "server", "every process"])
def test_sigint_ends_the_job_with_130_one_line_and_status_interrupted(tmp_path, target):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "c.yaml", small_config(out, rounds=500))
    proc = subprocess.Popen(fedmpi_cmd(3, "run", cfg), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True,
                            env={**os.environ, "FEDMPI_ROUND_DELAY_S": "0.3", "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while rows(out) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = rank_pids(cfg)
        assert sorted(pids) == [0, 1, 2], pids
        if target == "every process":      # a terminal's Ctrl-C: the whole process group
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(pids[2 if target == "worker" else 0], signal.SIGINT)
        began = time.monotonic()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # ~150 s of rounds were left (500 x 0.3 s): well under that is an interruption, not a finish; 60 s leaves
    # a loaded machine room for the ranks' shutdown.
    assert proc.returncode == EXIT_INTERRUPTED and time.monotonic() - began < 60
    lines = [line for line in err.splitlines() if line.startswith("fedmpi:")]
    assert len(lines) == 1 and lines[0].startswith("fedmpi: interrupted (SIGINT"), err
    assert "Traceback" not in err
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "interrupted" and f.attrs["error"] == lines[0][len("fedmpi: "):]
        assert f["metrics/round"].shape[0] >= 2


@pytest.mark.mpi
def test_a_failing_worker_is_named_once(tmp_path):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "c.yaml", small_config(out, rounds=4))
    proc = run_fedmpi(3, "run", cfg, env={"FEDMPI_INJECT_FAULT": "2:1"}, check=False, timeout=120)
    expected = "rank 2 failed: RuntimeError: injected fault (FEDMPI_INJECT_FAULT=2:1)"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fedmpi:")]
    assert lines == [f"fedmpi: {expected}"], proc.stderr
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and f.attrs["error"] == expected


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_a_diverging_run_stops_with_status_diverged_and_keeps_the_last_finite_checkpoint(tmp_path, n):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "c.yaml", small_config(out, rounds=6, model={"name": "mlp", "hidden": 32},
                                                         client={"lr": 1.0e6, "batch_size": 20},
                                                         checkpoint={"every": 1, "keep": 10}))
    proc = run_fedmpi(n, "run", cfg, check=False, timeout=180)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fedmpi:")]
    assert len(lines) == 1 and lines[0].startswith("fedmpi: diverged in round "), proc.stderr
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "diverged" and "diverged in round" in f.attrs["error"]
        logged = f["metrics/round"].shape[0]
    diverged_round = int(lines[0].split("round ")[1].split(":")[0])      # 1-based, as the console's
    assert logged == diverged_round       # the round that diverged is logged, nothing after it
    for path in glob.glob(str(out / "ckpt" / "ckpt-*.h5")):
        with h5py.File(path, "r") as f:
            assert np.isfinite(f["global"][()]).all(), path        # no checkpoint holds the non-finite model


def test_on_nonfinite_continue_logs_and_goes_on():
    cfg = small_config("unused", rounds=3, model={"name": "mlp", "hidden": 32}, client={"lr": 1.0e6, "batch_size": 20},
                       runtime={"threads": 1, "progress": "off", "on_nonfinite": "continue"})
    result = fedmpi.simulate(cfg)
    assert len(result.metrics["round"]) == 3 and not np.isfinite(result.model).all()


def test_nonfinite_config_values_and_stop_default():
    from fedmpi import config

    assert config.from_dict({}).runtime.on_nonfinite == "stop"
    with pytest.raises(config.ConfigError, match="client.lr"):
        config.from_dict({"client": {"lr": float("inf")}})


def test_a_finished_run_ignores_late_signals(tmp_path):
    """Finding 13: a SIGTERM during teardown (after the last round) must not kill the finished job with
    status 15. Python resets the handlers it installed at exit, before MPI finalizes; fedmpi sets them to
    ignore once the work is done, which Python leaves alone."""
    code = (
        "import signal, sys\n"
        "from fedmpi.mpi import signals\n"
        "from fedmpi.cli import main\n"
        f"rc = main(['run', {str(write_config(tmp_path / 'c.yaml', small_config(tmp_path / 'o', rounds=1)))!r}])\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM)\n"
        "import os; os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "o" / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "finished"
    signals.reset()


def test_a_worker_takes_part_in_a_whole_collective_before_a_ctrl_c_ends_it():
    """A SIGINT inside a collective is held to its end (fedmpi.mpi.comm MpiComm._whole): leaving a barrier rank 0
    had passed would leave rank 0 blocked in the collective after it. Then it raises, once; a second one
    meanwhile changes nothing."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *signals.STOP_SIGNALS)}
    signals.install()
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals.interrupt_after():
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)            # the handler runs here, in the main thread: nothing is raised yet
                done.append("collective")
        assert done == ["collective"] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with signals.interrupt_after():     # ignored already: nothing is held, nothing raised
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        signals.install()
        with signals.interrupt_after():     # no signal: the block ends as it would, the handler restored
            done.append("quiet")
        assert signal.getsignal(signal.SIGINT) is signals._interrupt
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
