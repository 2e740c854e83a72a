"""Shared test helpers: launching fedmpi under mpiexec with a timeout, writing configs, reading runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
MPI_TIMEOUT_S = 240


def script_module(folder, name, prefix, register=False):
    """FOLDER/NAME.py (bench/ and tools/ are sets of scripts, not packages) as a module of its own; `register`
    puts it in sys.modules (a tool's dataclasses need it there; a bench module's name, test_bench_NAME, would
    shadow the test file of that name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{prefix}_{name}", ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def bench_module(name, prefix="test_bench"):
    return script_module("bench", name, prefix)


def tool_module(name, prefix="test_tool"):
    return script_module("tools", name, prefix, register=True)

# Every process a test starts (each mpiexec rank, each tool run as a script) imports fedmpi afresh. Where the
# environment forbids bytecode files (PYTHONDONTWRITEBYTECODE), each of them compiled every fedmpi module from
# source again: about 0.1-0.2 s of CPU per process, hundreds of processes per suite. Those children write and
# reuse their bytecode under a cache folder outside the work tree instead (PYTHONPYCACHEPREFIX), so the
# repository still gets no __pycache__; Python checks each cached file against its source's mtime and size.
# Nothing a run computes depends on it. This pytest process itself is left as it started.
if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    import tempfile

    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), f"fedmpi-test-pycache-{os.getuid()}")


def mpiexec():
    from fedmpi.analysis.batch_report import find_mpiexec

    found = find_mpiexec()
    if not found:
        pytest.skip("mpiexec not found (pip install mpich, or load your site's MPI)")
    return found


# --- several nodes in MPI's own view on one machine (docs/how-to/multi-node.md, "Several nodes on one machine") --

NODE_HOST = "fedmpi-node{}"
# What the probe launch prints: per rank (node-local rank, node size, processor name), in world-rank order.
NODE_PROBE = ("from mpi4py import MPI\n"
              "c = MPI.COMM_WORLD; n = c.Split_type(MPI.COMM_TYPE_SHARED, key=c.rank)\n"
              "seen = c.gather([n.Get_rank(), n.Get_size(), MPI.Get_processor_name()])\n"
              "print(__import__('json').dumps(seen)) if c.rank == 0 else None\n")
_NODE_LAUNCHES = {}


# A run in this process ends by ignoring SIGTERM, SIGUSR1 and SIGINT (fedmpi.mpi.signals.ignore_all), and an
# ignored signal is inherited through exec: a batch script that a later test of the same pytest worker starts
# could then not trap the warning signal at all (bash cannot trap a signal ignored on entry). Such runs happen
# in tests and in module-scoped fixtures, so every test starts with the dispositions the worker started with.
_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
_STARTING_DISPOSITIONS = {sig: signal.getsignal(sig) for sig in _SIGNALS}


@pytest.fixture(autouse=True)
def _signal_dispositions_restored():
    for sig, handler in _STARTING_DISPOSITIONS.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@dataclass(frozen=True)
class NodeLaunch:
    """How to start `nodes` x `per_node` ranks on this machine as several nodes: `argv` (the mpiexec prefix,
    the command follows), `env` (added to the launch's environment) and `kind`: "mpi" where MPI itself places
    the ranks on `nodes` hosts (its shared-memory split gives `nodes` node communicators), "pretend" where it
    cannot here (fedmpi's FEDMPI_TEST_NODES split instead; `why` says what failed), `hostnames` whether each
    node also has its own host name (a UTS namespace per rank)."""

    argv: tuple
    env: dict
    kind: str
    hostnames: bool = False
    why: str = ""


def node_launch(nodes, per_node):
    """The NodeLaunch for `nodes` x `per_node` ranks (probed once per session, ~0.5 s): MPICH's Hydra with a
    host list of distinct names and its fork launcher (`-launcher fork -hosts fedmpi-node0:2,...`: every
    "host" is this machine, the names need not resolve), inter-node traffic forced onto UCX's TCP transport
    (UCX would otherwise notice the one machine and use its own shared memory), and where unshare(1) may
    make UTS namespaces, each rank's host name set to its node's; else pretend nodes."""
    key = (nodes, per_node)
    if key not in _NODE_LAUNCHES:
        _NODE_LAUNCHES[key] = _probe_node_launch(nodes, per_node)
    return _NODE_LAUNCHES[key]


def mpiexec_nodes(nodes, per_node):
    """The argv prefix of a launch that MPI itself places on `nodes` hosts of `per_node` ranks each; skips
    the test, with the reason, where no such launch works here."""
    found = node_launch(nodes, per_node)
    if found.kind != "mpi":
        pytest.skip(f"no launch places ranks on several MPI nodes here: {found.why}")
    return list(found.argv)


def _probe_node_launch(nodes, per_node):
    import shutil

    n = nodes * per_node
    pretend = NodeLaunch((mpiexec(), "-n", str(n)), {"FEDMPI_TEST_NODES": str(nodes)}, "pretend")
    version = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True, timeout=30).stdout
    if "HYDRA" not in version:
        return replace(pretend, why=f"{mpiexec()} is not MPICH's Hydra (its -hosts/-launcher fork are needed)")
    hosts = ",".join(f"{NODE_HOST.format(i)}:{per_node}" for i in range(nodes))
    base = (mpiexec(), "-launcher", "fork", "-hosts", hosts, "-genv", "UCX_TLS", "tcp,self", "-n", str(n))
    uts = ("unshare", "-u", "sh", "-c", f"hostname {NODE_HOST.format(f'$((PMI_RANK / {per_node}))')} && "
           f'exec "$@"', "sh")
    tried = []
    can_unshare = shutil.which("unshare") and shutil.which("hostname") and subprocess.run(
        ["unshare", "-u", "true"], capture_output=True, timeout=30).returncode == 0
    for argv, named in ((base + uts, True), (base, False)) if can_unshare else ((base, False),):
        try:
            # generous: on a loaded machine the ranks' start is slow, and a timeout here means "cannot"
            proc = subprocess.run([*argv, sys.executable, "-c", NODE_PROBE], capture_output=True, text=True,
                                  timeout=MPI_TIMEOUT_S, cwd=ROOT)
        except subprocess.TimeoutExpired:
            tried.append(f"{' '.join(argv[:6])} ... did not end within 60 s")
            continue
        try:
            seen = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            tried.append(f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            continue
        layout = [(r // per_node, r % per_node) for r in range(n)]
        if [(local, size) for local, size, _ in seen] != [(p, per_node) for _, p in layout]:
            tried.append(f"MPI's shared split gave {seen}")
            continue
        names = [name for _, _, name in seen]
        if named and names != [NODE_HOST.format(node) for node, _ in layout]:
            tried.append(f"host names {names}")
            continue
        return NodeLaunch(argv, {}, "mpi", named)
    return replace(pretend, why="; ".join(tried))


def fedmpi_cmd(n, *args):
    """The command line for `fedmpi ARGS` at `-n n` (always through mpiexec, -n 1 included)."""
    return [mpiexec(), "-n", str(n), sys.executable, "-m", "fedmpi", *map(str, args)]


def run_fedmpi(n, *args, timeout=MPI_TIMEOUT_S, env=None, check=True):
    """Runs fedmpi under mpiexec; returns the CompletedProcess. `check` asserts exit 0."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(fedmpi_cmd(n, *args), capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"fedmpi -n {n} {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


def write_config(path, mapping):
    path = Path(path)
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


def read_metrics(run_dir):
    with h5py.File(Path(run_dir) / "run.h5", "r", locking=False) as f:
        return {k: ds[()] for k, ds in f["metrics"].items()}, dict(f.attrs)


def same(a, b):
    """Equal arrays, NaN equal to NaN where the values are numbers (/metrics/model_sha256 is text)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.array_equal(a, b, equal_nan=a.dtype.kind == "f" and b.dtype.kind == "f")


def read_clients(run_dir):
    """{name: [round, client]} of a run's /clients, whichever layout the file has (fedmpi.io.store.client_table)."""
    from fedmpi.io.store import read_clients as read

    return read(str(Path(run_dir) / "run.h5"))


def read_global(run_dir):
    with h5py.File(Path(run_dir) / "run.h5", "r", locking=False) as f:
        return np.asarray(f["model/global"][()])


def small_config(out, **sections):
    """A small, fast mnist5k config (lr model) for end-to-end tests; `sections` replace top-level keys."""
    cfg = {
        "seed": 1, "rounds": 3, "out": str(out),
        "data": {"name": "mnist5k"},
        "partition": {"clients": 12, "scheme": "dirichlet", "beta": 0.5},
        "model": {"name": "lr"},
        "client": {"lr": 0.05, "batch_size": 20, "epochs": 1},
        "server": {"clients_per_round": 5},
        "algorithm": {"name": "fedavg"},
        "runtime": {"threads": 1, "progress": "lines"},
    }
    cfg.update(sections)
    return cfg


def run_many(n, config_paths, timeout=MPI_TIMEOUT_S, env=None):
    """Runs several configs sequentially inside one mpiexec launch (one torch import per rank), each into
    its own `out`, with the project's batch runner tools/run_batch.py; `env` adds environment variables."""
    script = ROOT / "tools" / "run_batch.py"
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, str(script), *map(str, config_paths),
                           "--overwrite"],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if proc.returncode != 0:
        raise AssertionError(f"run_many -n {n} exited {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


# One MPI launch, several `fedmpi run` commands in sequence (resumes included): what `fedmpi run ARGS` does,
# through `fedmpi.cli.main`, once per command, stopping at the first non-zero exit.
STEPS_DRIVER = r"""
import json, sys
from fedmpi.cli import main
for args in json.loads(sys.argv[1]):
    code = main(["run", *args])
    if code:
        sys.exit(code)
"""


def run_steps(n, steps, env=None, timeout=MPI_TIMEOUT_S):
    """Runs `fedmpi run ARGS` for each ARGS (a list of strings: config, overrides, --resume...) of `steps`
    inside ONE mpiexec launch (one torch import per rank). `env` adds environment variables (e.g. a
    PYTHONPATH for out-of-tree algorithms). Asserts exit 0; returns the CompletedProcess."""
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-c", STEPS_DRIVER,
           json.dumps([[str(a) for a in step] for step in steps])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    if proc.returncode != 0:
        raise AssertionError(f"run_steps -n {n} exited {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\n"
                             f"stderr:\n{proc.stderr[-4000:]}")
    return proc


def run_steps_env(n, steps, timeout=MPI_TIMEOUT_S):
    """Like run_steps, each step an (env, args) pair: `env` ({name: value or None}) applies to that
    `fedmpi run ARGS` alone (for the test aids fedmpi reads when a run starts: FEDMPI_TEST_NODES,
    FEDMPI_NODE_BUFFERS, FEDMPI_TEST_DEVICE_MPI), so that runs needing different ones still share ONE mpiexec
    launch (tests/session_runs.py's driver); asserts exit 0; returns the CompletedProcess."""
    import session_runs

    return session_runs.launch(n, [[{k: (None if v is None else str(v)) for k, v in env.items()}, "run", *args]
                                   for env, args in steps], timeout)


def pytest_collection_modifyitems(config, items):
    """The MPI tests whose setup may run the launches shared between files (tests/session_runs.py) get the
    time those take."""
    import session_runs

    session_runs.allow_for_the_launches(items)


# --- driving algorithm hooks directly (rule tests on hand-computed cases) -----------------------------

class VecModel:
    """Stands in for FlatModel where a hook only uses .vec and .load()."""

    def __init__(self, dim):
        self.vec = torch.zeros(dim)
        self.device = self.vec.device

    def load(self, v):
        self.vec.copy_(v)


def setup_algo(algo, sizes, server_idx=(), x0=None, probe=None):
    """`Algorithm.setup` as Experiment calls it."""
    from fedmpi.algorithms import SetupContext

    x0 = torch.zeros(algo.dim) if x0 is None else x0
    algo.setup(SetupContext(np.asarray(sizes), np.asarray(server_idx, dtype=np.int64), x0, probe))
    return algo


def server_update(algo, x, acc, weight, t=0, server_lr=1.0):
    """The engine's server update of round t (`Server.apply`: aggregate, the default server optimizer, sgd at
    `server_lr` (the config's server.lr), after_step) from the upload sums `acc` and their weight; returns the
    new x (`x` itself is left as it was)."""
    from types import SimpleNamespace

    from fedmpi import config
    from fedmpi.core.schedules import LearningRate
    from fedmpi.round.server import Server

    flat = SimpleNamespace(device=x.device, dim=algo.dim, n_params=algo.n_params)
    cfg = config.from_dict({"server": {"lr": server_lr}})
    server = Server(algo, flat, x, server=cfg.server, rounds=cfg.rounds,
                    client_rate=LearningRate.of(cfg.client, cfg.rounds), wire_dtype=cfg.runtime.wire_dtype)
    server.apply(t, acc, weight)
    return server.x


# --- a small disk of its own (full-disk tests) ---------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """make(size_kb, free_kb) -> a folder on its own tmpfs of `size_kb` with `free_kb` left free; unmounted once
    the ranks a launcher killed have let go of it. Skips where this machine cannot mount one (not root)."""
    mounts = []

    def make(size_kb, free_kb):
        where = tmp_path / f"disk{len(mounts)}"
        where.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or proc.returncode}); the "
                        f"FEDMPI_TEST_WRITE_FAIL and RLIMIT_FSIZE cases cover the same paths")
        mounts.append(where)
        st = os.statvfs(where)
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize - free_kb * 1024)
        finally:
            os.close(fd)
        return where

    yield make
    for where in mounts:
        for _ in range(50):
            if subprocess.run(["umount", str(where)], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        else:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)
