"""Performance plumbing (issue 8): the run log stays readable while the writer keeps it open between rounds,
the cached mnist5k parse, and the device-buffer path of runtime.cuda_aware_mpi (exercised on the CPU)."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from fedmpi import config
from fedmpi.io.store import RunLog

HANG_S = 240        # the subprocesses' timeouts only guard against a hang: generous, as load slows Python's start

READER = """
import sys, h5py
from fedmpi.io.store import client_table, open_run
with open_run(sys.argv[1]) as f:
    rounds = f["metrics/round"][()]
    loss = client_table(f).dense("loss")
with h5py.File(sys.argv[1], "r") as f:          # a reader with HDF5's default file locking
    assert len(f["metrics/round"]) == len(rounds)
print(len(rounds), ",".join(str(int(r)) for r in rounds), float(loss[-1, 1]))
"""


def read_in_another_process(path):
    proc = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True,
                          timeout=HANG_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    n, rounds, last = proc.stdout.split()[:3]
    return int(n), rounds, float(last)


def test_a_reader_sees_every_appended_round_while_the_writer_keeps_the_file_open(tmp_path):
    path = tmp_path / "run.h5"
    cfg = config.from_dict({"out": str(tmp_path)})
    log = RunLog.create(str(path), cfg, 1, ["host"], {})
    clients = 4
    for t in range(3):
        log.append({"round": t, "test_acc": 0.5}, {"loss": np.full(clients, t, np.float32)}, num_clients=clients)
    assert log._f is not None                   # kept open between rounds
    assert read_in_another_process(path) == (3, "0,1,2", 2.0)
    for t in range(3, 5):
        log.append({"round": t}, {"loss": np.full(clients, t, np.float32)}, num_clients=clients)
    assert read_in_another_process(path) == (5, "0,1,2,3,4", 4.0)
    report = subprocess.run([sys.executable, "-m", "fedmpi", "report", str(path)], capture_output=True, text=True,
                            timeout=HANG_S, cwd=ROOT)
    assert report.returncode == 0, report.stderr
    log.write_model(np.zeros(3, np.float32))    # every other write closes the appending handle
    assert log._f is None
    log.append({"round": 5}, {"loss": np.full(clients, 5, np.float32)}, num_clients=clients)
    log.finish("finished")
    assert log._f is None
    assert read_in_another_process(path) == (6, "0,1,2,3,4,5", 5.0)


def _write_mnist5k(path, rows=50, seed=0):
    import gzip

    g = np.random.default_rng(seed)
    table = np.concatenate([g.integers(0, 256, (rows, 784)), np.arange(rows)[:, None] % 10], axis=1)
    with gzip.open(path, "wt") as fh:
        np.savetxt(fh, table, fmt="%d", delimiter=",")


def test_mnist5k_parse_is_cached_by_path_size_and_mtime(tmp_path, monkeypatch):
    import os

    from fedmpi.data import sources

    monkeypatch.setenv("FEDMPI_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "data"
    root.mkdir()
    _write_mnist5k(root / "mnist_5k.csv.gz")
    calls = []
    parse = sources._parse_mnist5k
    monkeypatch.setattr(sources, "_parse_mnist5k", lambda p: calls.append(p) or parse(p))
    first = sources._cached_parse(str(root / "mnist_5k.csv.gz"), sources._parse_mnist5k)
    again = sources._cached_parse(str(root / "mnist_5k.csv.gz"), sources._parse_mnist5k)
    assert len(calls) == 1 and np.array_equal(first, again) and first.shape == (50, 785)
    (cached,) = (tmp_path / "cache").iterdir()
    cached.write_bytes(b"damaged")                      # a damaged cache only means parsing again
    assert np.array_equal(sources._cached_parse(str(root / "mnist_5k.csv.gz"), sources._parse_mnist5k), first)
    assert len(calls) == 2
    _write_mnist5k(root / "mnist_5k.csv.gz", seed=1)    # a changed file is parsed afresh
    os.utime(root / "mnist_5k.csv.gz", ns=(1, 1))
    changed = sources._cached_parse(str(root / "mnist_5k.csv.gz"), sources._parse_mnist5k)
    assert len(calls) == 3 and not np.array_equal(changed, first)
    ds = sources.mnist5k(config.DataConfig(name="mnist5k", root=str(root)))
    assert len(ds.y_train) + len(ds.y_test) == 50
    monkeypatch.setenv("FEDMPI_CACHE_DIR", "")         # caching off
    sources._cached_parse(str(root / "mnist_5k.csv.gz"), sources._parse_mnist5k)
    assert len(calls) == 4


# -- device buffers and runtime.cuda_aware_mpi, exercised on the CPU ------------------------------------

DEVICE_CASES = {
    "fedavg": {},
    "fedskip": {"algorithm": {"name": "fedskip", "delta": 2}, "rounds": 4},
    "safl_gated": {"algorithm": {"name": "safl", "eps": 0.5, "L": 5.0, "gating": True, "nu": 20.0}},
    "scaffold": {"algorithm": {"name": "scaffold"}},
}


def _small(out, runtime, **sections):
    from conftest import small_config

    cfg = small_config(out, **{"rounds": 3, **sections})
    cfg["runtime"] = {**cfg["runtime"], **runtime}
    return cfg


def _inprocess(mapping):
    import fedmpi

    result = fedmpi.simulate(mapping)
    return result.experiment, result


def test_device_mpi_buffers_give_the_same_rounds(tmp_path, monkeypatch):
    """With cuda_aware_mpi the device buffers (here on the CPU) go to the communicator themselves."""
    monkeypatch.setenv("FEDMPI_TEST_DEVICE_MPI", "1")
    for name, sections in DEVICE_CASES.items():
        plain, a = _inprocess(_small(tmp_path / name, {}, **sections))
        device, b = _inprocess(_small(tmp_path / name, {"cuda_aware_mpi": True}, **sections))
        assert device.wire.device_mpi and device.wire.down_dev is not None and not plain.wire.device_mpi
        np.testing.assert_array_equal(b.model, a.model)
        assert a.metrics.keys() == b.metrics.keys() and a.clients.keys() == b.clients.keys(), name
        for key in a.metrics:
            if key != "wall_s":
                np.testing.assert_array_equal(b.metrics[key], a.metrics[key], err_msg=f"{name} {key}")
        for key in a.clients:
            np.testing.assert_array_equal(b.clients[key], a.clients[key], err_msg=f"{name} {key}")


@pytest.mark.mpi
def test_device_mpi_path_at_three_ranks(tmp_path):
    from conftest import read_global, read_metrics, run_fedmpi, write_config

    runs = {}
    for key, n, runtime in [("plain", 1, {}), ("device", 3, {"cuda_aware_mpi": True})]:
        cfg = write_config(tmp_path / f"{key}.yaml", _small(tmp_path / key, runtime))
        run_fedmpi(n, "run", cfg, env={"FEDMPI_TEST_DEVICE_MPI": "1"})
        runs[key] = tmp_path / key
    (ma, _), (mb, _) = read_metrics(runs["plain"]), read_metrics(runs["device"])
    np.testing.assert_array_equal(mb["test_acc"], ma["test_acc"])
    np.testing.assert_allclose(read_global(runs["device"]), read_global(runs["plain"]), rtol=1e-6, atol=1e-7)
