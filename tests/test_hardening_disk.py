"""Issue 17, the files on disk (tried as a hostile or careless user would): a full disk or a file-size limit costs
no finished round, legacy MNIST files and checkpoint names fedmpi never writes are ignored or set aside, the
output folder's lock names its holder and dies with it. Split from tests/test_hardening.py by topic (that file
has the data files that must not run code and the inputs that exit 2); the MPI cases are in
test_hardening_mpi.py."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import ROOT, fedmpi_cmd, small_config, write_config
from dataset_files import write_cifar, write_mnist_family
from test_hardening import SUBPROCESS_TIMEOUT_S, data_cfg, fedmpi

from fedmpi import config
from fedmpi.core.errors import EXIT_FAILED, EXIT_USAGE, ConfigError, InputError
from fedmpi.data import load_dataset
from fedmpi.io import checkpoint, resume
from fedmpi.io.store import RunLog

# -- finding 3: a full disk ----------------------------------------------------------------------------



def many_clients_config(path, out, clients, rounds, per_round, **sections):
    """Synthetic data, one client per generating user, `per_round` of them a round: /clients rows (ids,
    selected, loss) of `per_round` entries, so that run.h5 grows by 3 x 64 x per_round x 4 bytes every 64
    rounds."""
    return write_config(path, small_config(out, data={"name": "synthetic"}, rounds=rounds,
                        partition={"clients": clients, "scheme": "natural", "samples_per_client": 20},
                        server={"clients_per_round": per_round}, checkpoint={"every": 0}, eval={"every": 50},
                        **sections))


def assert_clean_write_failure(proc, out, reason, rows):
    """Exit 1 with the one line naming run.h5 and the system's reason; the rows before it readable."""
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fedmpi:")]
    # The prefix "rank 0 failed: WriteFailed:" is launch.py's (the lead's failure format).
    assert any(re.fullmatch(rf"fedmpi: (rank 0 failed: (WriteFailed: )?)?cannot write {re.escape(str(out))}"
                            rf"/run\.h5: {reason}", line) for line in lines), lines
    assert "Segmentation fault" not in proc.stderr and "Traceback" not in proc.stderr
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and reason in f.attrs["error"]
        assert f["metrics/round"][()].tolist() == list(range(rows))
        assert all(ds.shape[0] == rows for ds in f["metrics"].values())
        assert all(ds.shape[0] == rows for ds in f["clients"].values())


def test_full_disk_during_the_rounds_keeps_every_finished_round(tmp_path, small_disk):
    # 2,666 clients a round: the first row allocates 2 MB of /clients chunks, row 64 would need 2 MB more.
    # With 4 MB free, rows 0..63 fit and row 64 is refused (main: segfault, status left `running`).
    disk = small_disk(8192, 4000)
    out = disk / "run"
    cfg = many_clients_config(tmp_path / "c.yaml", out, clients=4000, rounds=70, per_round=2666)
    proc = fedmpi("run", cfg)
    assert_clean_write_failure(proc, out, "No space left on device", rows=64)
    assert not (out / "run.h5.model.tmp").exists()


def test_full_disk_at_the_final_model_keeps_the_run_readable(tmp_path, small_disk):
    # An mlp of 795k parameters (3.2 MB) does not fit into 3 MB (main: run.h5 left unreadable).
    disk = small_disk(8192, 3000)
    out = disk / "run"
    cfg = write_config(tmp_path / "c.yaml", small_config(out, model={"name": "mlp", "hidden": 1000}, rounds=2,
                                                         checkpoint={"every": 0}))
    proc = fedmpi("run", cfg)
    assert_clean_write_failure(proc, out, "No space left on device", rows=2)
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert "model" not in f
    assert sorted(os.listdir(out)) == [".fedmpi.lock", "run.h5"]      # no temporary copy, reserve given back


def test_file_size_limit_is_reported_like_a_full_disk(tmp_path):
    out = tmp_path / "run"
    cfg = many_clients_config(tmp_path / "c.yaml", out, clients=4000, rounds=70, per_round=2666)
    # The limit is set once MPI has started (MPI's shared-memory set-up needs bigger files than 3.7 MB).
    limited = ("import resource, sys; from mpi4py import MPI; "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (3_700_000, 3_700_000)); "
               f"from fedmpi.cli import main; sys.exit(main(['run', {str(cfg)!r}]))")
    proc = subprocess.run([*fedmpi_cmd(1)[:-2], "-c", limited], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert_clean_write_failure(proc, out, "File too large", rows=64)


def _run_log_script(disk, body):
    """Runs `body` after creating a RunLog in `disk` (h5py and numpy only, no torch) in a subprocess, so that
    a segfault is seen as one; returns the CompletedProcess."""
    script = f"""
import os, sys
import numpy as np
from fedmpi import config
from fedmpi.io import disk_room, store
cfg = config.from_dict({{"out": {str(disk)!r}}})
log = store.RunLog.create({str(disk / "run.h5")!r}, cfg, 1, ["h"], {{}})

def fill_disk():
    # Another job takes every free block.
    fd = os.open({str(disk / "other_job")!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"x" * 512)
    except OSError:
        pass
    os.close(fd)
""" + body
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_another_job_filling_the_disk_between_rounds_costs_no_round(small_disk):
    """statvfs cannot protect against a concurrent writer (or a quota); the reservation can: with the disk
    taken to its last byte after every row, the next row is refused before anything is written, and the
    final status still fits into the room reserved for the last row (main: segfault or unreadable file)."""
    disk = small_disk(16384, 8192)
    proc = _run_log_script(disk, """
rows = 0
try:
    for t in range(200):
        log.append({"round": t}, {"loss": np.ones(4000)}, num_clients=4000)
        rows += 1
        fill_disk()
except Exception as e:  # noqa: BLE001 - main raises other types
    print("refused:", e)
log.finish("failed", "disk full")
print("rows", rows)
""")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"refused: cannot write {disk / 'run.h5'}: No space left on device" in proc.stdout
    assert os.statvfs(disk).f_bavail == 0 or os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize < 1 << 20
    rows = int(proc.stdout.split("rows")[-1])
    assert rows >= 1
    with h5py.File(disk / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and f["metrics/round"][()].tolist() == list(range(rows))


def test_without_reservation_the_free_space_check_refuses_a_row(small_disk):
    """Where the file system cannot reserve blocks (NFS v3, ...), statvfs decides: a disk with less free
    room than a row needs refuses the row and keeps the file."""
    disk = small_disk(4096, 1500)
    proc = _run_log_script(disk, """
disk_room.FALLOCATE = None
log.append({"round": 0})
try:
    log.append({"round": 1}, {"loss": np.ones(4000)}, num_clients=4000)    # needs 1 MB + slack
except disk_room.WriteFailed as e:
    print("refused:", e)
log.finish("failed", "disk full")
""")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"refused: cannot write {disk / 'run.h5'}: No space left on device" in proc.stdout
    with h5py.File(disk / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and f["metrics/round"][()].tolist() == [0]
        assert "clients/loss" not in f


# -- finding 13 (my part): legacy MNIST files, checkpoint names -------------------------------------------

def test_legacy_processed_mnist_files_are_ignored_in_favour_of_raw(tmp_path):
    import torch

    written = write_mnist_family(tmp_path, "MNIST", n_train=30, n_test=10)
    processed = tmp_path / "MNIST" / "processed"
    processed.mkdir()
    for name, n in (("training.pt", 30), ("test.pt", 10)):
        torch.save((torch.zeros(n, 28, 28, dtype=torch.uint8), torch.full((n,), 7)), processed / name)
    ds = load_dataset(data_cfg("mnist", tmp_path))
    assert np.array_equal(ds.y_train, written["train"][1]) and np.array_equal(ds.y_test, written["test"][1])
    # Without raw/, the error names the raw files, never processed/.
    shutil.rmtree(tmp_path / "MNIST" / "raw")
    with pytest.raises(InputError, match="expected train-images-idx3-ubyte.*MNIST/raw"):
        load_dataset(data_cfg("mnist", tmp_path))


def _checkpointed_run(tmp_path, rounds):
    cfg = config.from_dict(small_config(tmp_path, rounds=8, checkpoint={"every": 2, "keep": 5}))
    log = RunLog.create(os.path.join(cfg.out, "run.h5"), cfg, 1, ["host"], {})
    for t in range(8):
        log.append({"round": t})
    log.close()
    paths = {}
    for k in rounds:
        w = checkpoint.CheckpointWriter(cfg, k, wall_s=float(k), world_size=1)
        w.put_server_side({"global": np.full(10, k, dtype=np.float32)})
        paths[k] = w.commit(cfg.checkpoint.keep)
    return cfg, paths


def test_checkpoint_whose_round_disagrees_with_its_name_is_set_aside(tmp_path):
    cfg, paths = _checkpointed_run(tmp_path, (2, 4))
    renamed = checkpoint.ckpt_path(cfg.out, 6)
    shutil.copy(paths[2], renamed)          # a valid checkpoint of round 2 under the name of round 6
    said = []
    point = resume.choose(cfg, say=said.append)
    assert point.round == 4 and point.path == paths[4]
    assert point.damaged == [(renamed, "its round attribute is 2 but its file name says round 6")]
    assert any("ckpt-6.h5 is damaged" in line for line in said)
    resume.set_aside(point)
    assert not Path(renamed).exists() and Path(renamed + ".damaged").exists()


def test_checkpoint_names_fedmpi_never_writes_are_not_checkpoints(tmp_path):
    cfg, paths = _checkpointed_run(tmp_path, (2,))
    shutil.copy(paths[2], os.path.join(checkpoint.ckpt_dir(cfg.out), "ckpt-004.h5"))
    assert checkpoint.list_checkpoints(cfg.out) == [(2, paths[2])]


# -- finding 4 (single-process part): the lock -----------------------------------------------------------

def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    from fedmpi.io.outdir import claim_here

    held = claim_here(str(tmp_path))
    assert (tmp_path / ".fedmpi.lock").read_text().startswith(f"host {socket.gethostname()} pid {os.getpid()} ")
    # Another process (flock locks belong to the open file) is refused while this one holds it...
    probe = ("import sys; from fedmpi.io.outdir import claim_here; from fedmpi.core.errors import ConfigError\n"
             f"try:\n    claim_here({str(tmp_path)!r})\nexcept ConfigError as e:\n    print(e); sys.exit(2)")
    # timeouts here only guard against a hang: generous, as Python's start is slow on a loaded machine
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 2 and f"pid {os.getpid()}" in proc.stdout
    assert "in use by another fedmpi job" in proc.stdout
    # ...and let in once it is released (as when the holding process ends).
    held.release()
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout


def test_download_goes_through_torchvision_fetch_and_fedmpi_reads_the_files(tmp_path, monkeypatch):
    """data.download: torchvision's own download (MD5-checked archives) puts the files in place; fedmpi then
    reads them itself (never through torchvision's readers, which unpickle and torch.load). The network is
    replaced by writers of the same files."""
    import torchvision.datasets.mnist as tv_mnist
    import torchvision.datasets.utils as tv_utils

    fetched = []

    def fake_mnist_archive(url, download_root, filename=None, md5=None, **_):
        fetched.append((filename, md5))
        if len(fetched) == 4:                   # all four archives "downloaded": unpack them at once
            staging = tmp_path / "staging"
            write_mnist_family(staging, "MNIST", n_train=30, n_test=10)
            for path in (staging / "MNIST" / "raw").iterdir():
                shutil.copy(path, Path(download_root) / path.name)

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", fake_mnist_archive)
    ds = load_dataset(data_cfg("mnist", tmp_path / "root", download=True))
    assert [name for name, _ in fetched] == [f"{n}.gz" for n in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                                                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]
    assert all(md5 for _, md5 in fetched) and ds.x_train.shape == (30, 1, 28, 28)

    def fake_cifar_archive(url, download_root, filename=None, md5=None, **_):
        fetched.append((filename, md5))
        write_cifar(download_root, "cifar10", n_train=20, n_test=10)

    monkeypatch.setattr(tv_utils, "download_and_extract_archive", fake_cifar_archive)
    ds = load_dataset(data_cfg("cifar10", tmp_path / "root", download=True))
    assert fetched[-1] == ("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a")
    assert ds.x_train.shape == (20, 3, 32, 32)
    load_dataset(data_cfg("cifar10", tmp_path / "root", download=True))      # present: nothing fetched again
    assert len(fetched) == 5


def test_one_process_may_claim_the_same_out_again(tmp_path):
    """A script that runs a config and then resumes it through fedmpi.cli.main claims its out twice."""
    from fedmpi.io.outdir import claim_here

    first = claim_here(str(tmp_path))
    (tmp_path / "run.h5").write_bytes(b"")
    again = claim_here(str(tmp_path / "."), resume=True)
    assert again is first and first.fd is not None
    with pytest.raises(ConfigError, match="already holds a run"):      # the content checks still apply
        claim_here(str(tmp_path))
    assert first.fd is not None                                         # and a refusal keeps the held lock
    first.release()


def test_run_batch_stops_at_an_out_another_job_holds(tmp_path):
    from fedmpi.io.outdir import claim_here

    out = tmp_path / "busy"
    cfg = write_config(tmp_path / "c.yaml", small_config(out, rounds=1))
    held = claim_here(str(out))
    try:
        proc = subprocess.run([*fedmpi_cmd(1)[:-2], str(ROOT / "tools" / "run_batch.py"), str(cfg), "--overwrite"],
                              capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    finally:
        held.release()
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert f"pid {os.getpid()} " in proc.stderr and "in use by another fedmpi job" in proc.stderr
    assert sorted(os.listdir(out)) == [".fedmpi.lock"]
