"""Issue 17, tried as a hostile or careless user would: no data file runs code, a full disk costs no finished
round, every bad input exits 2 naming the key or file, YAML means what the docs say. One test (or a few)
per finding; the MPI cases are in test_hardening_mpi.py."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from conftest import ROOT, fedmpi_cmd, small_config, write_config
from dataset_files import write_cifar, write_leaf, write_mnist_family

from fedmpi import config
from fedmpi.cli import main
from fedmpi.core.errors import EXIT_FAILED, EXIT_USAGE, ConfigError, InputError
from fedmpi.data import load_dataset
from fedmpi.io import checkpoint, resume
from fedmpi.io.store import RunLog

SUBPROCESS_TIMEOUT_S = 240


def cli(capsys, *args):
    """fedmpi's CLI in this process (config errors are raised before MPI starts): (exit code, stderr)."""
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def fedmpi(*args, n=1, env=None, preexec_fn=None, timeout=SUBPROCESS_TIMEOUT_S):
    return subprocess.run(fedmpi_cmd(n, *args), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, preexec_fn=preexec_fn)


def data_cfg(name, root, **data):
    return config.from_dict({"data": {"name": name, "root": str(root), **data},
                             "partition": {"clients": 3, "scheme": "iid"}, "server": {"clients_per_round": 1}})


# -- finding 1: a CIFAR batch must not run code ---------------------------------------------------------

class _WritesMarker:
    """Pickles as a call of builtins.exec that creates the marker file: what a crafted batch would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code ran')",)


def write_malicious_batch(path, marker):
    with open(path, "wb") as fh:
        pickle.dump({"data": _WritesMarker(marker), "labels": [0]}, fh, protocol=2)


def malicious_cifar_run(tmp_path, batch_name, n_train):
    """A CIFAR-10 folder whose `batch_name` would run code (writing the returned marker) if unpickled, and
    the config of a one-round run on it: (config path, marker, batch path)."""
    write_cifar(tmp_path / "data", "cifar10", n_train=n_train, n_test=10)
    marker = tmp_path / "marker"
    batch = tmp_path / "data" / "cifar-10-batches-py" / batch_name
    write_malicious_batch(batch, marker)
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out", data={"name": "cifar10",
                       "root": str(tmp_path / "data")}, partition={"clients": 4, "scheme": "iid"},
                       server={"clients_per_round": 2}, rounds=1))
    return cfg, marker, batch


@pytest.mark.parametrize("kind, batch", [("cifar10", "cifar-10-batches-py/data_batch_3"),
                                         ("cifar100", "cifar-100-python/train")])
def test_malicious_cifar_batch_is_refused_without_running_code(tmp_path, kind, batch):
    write_cifar(tmp_path, kind, n_train=50, n_test=10)
    marker = tmp_path / "marker"
    write_malicious_batch(tmp_path / batch, marker)
    with pytest.raises(InputError) as info:
        load_dataset(data_cfg(kind, tmp_path))
    assert not marker.exists()
    assert str(tmp_path / batch) in str(info.value) and "exec, which a CIFAR batch never contains" in str(info.value)


def test_malicious_cifar_batch_exits_2_in_a_run_and_a_dry_run(tmp_path):
    cfg, marker, batch = malicious_cifar_run(tmp_path, "data_batch_1", n_train=50)
    for extra in (["--dry-run"], []):
        proc = fedmpi("run", cfg, *extra)
        assert not marker.exists(), extra
        assert proc.returncode == EXIT_USAGE, proc.stderr
        assert str(batch) in proc.stderr and "Traceback" not in proc.stderr


def test_cifar_batches_as_numpy_pickles_them_still_load(tmp_path):
    """The reader keeps what batches re-pickled by Python 3 need: protocols 2 (bytes via _codecs.encode),
    4 and 5 (numpy's _frombuffer), and bytes keys."""
    written = write_cifar(tmp_path, "cifar10", n_train=50, n_test=10)
    folder = tmp_path / "cifar-10-batches-py"
    for protocol, name in ((4, "data_batch_2"), (5, "data_batch_3")):
        with open(folder / name, "rb") as fh:
            entry = pickle.load(fh)
        with open(folder / name, "wb") as fh:
            pickle.dump({k.encode(): v for k, v in entry.items()} if protocol == 5 else entry, fh, protocol=protocol)
    ds = load_dataset(data_cfg("cifar10", tmp_path))
    assert np.array_equal(ds.y_train, written["train"][1]) and ds.x_train.shape == (50, 3, 32, 32)


def test_cifar_batch_with_nan_pixels_is_an_input_error_naming_it(tmp_path):
    write_cifar(tmp_path, "cifar10", n_train=50, n_test=10)
    batch = tmp_path / "cifar-10-batches-py" / "test_batch"
    data = np.full((10, 3072), np.nan)
    with open(batch, "wb") as fh:
        pickle.dump({"data": data, "labels": list(range(10))}, fh, protocol=2)
    with pytest.raises(InputError, match=re.escape(str(batch)) + ".*uint8"):
        load_dataset(data_cfg("cifar10", tmp_path))


# -- finding 2: range errors in a section exit 2 naming every key -----------------------------------------

def test_range_errors_in_sections_exit_2_naming_every_key(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    code, err = cli(capsys, "run", cfg, "partition.clients=0", "server.clients_per_round=0", "server.lr=-1",
                    "partition.beta=0", "seed=-1")
    assert code == EXIT_USAGE
    for key in ("partition.clients = 0", "server.clients_per_round = 0", "server.lr = -1.0", "partition.beta = 0.0",
                "seed = -1"):
        assert key in err, key
    assert "Traceback" not in err and "AttributeError" not in err
    for override in ("partition.clients=0", "server.clients_per_round=0", "server.lr=-1", "partition.beta=0"):
        with pytest.raises(ConfigError, match=re.escape(override.split("=")[0])):
            config.load(str(cfg), [override])


def test_cross_section_check_is_not_judged_on_defaults_of_a_broken_section(tmp_path):
    # partition.clients is not an integer: comparing clients_per_round with the default 30 would be wrong.
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    with pytest.raises(ConfigError) as info:
        config.load(str(cfg), ["partition.clients=many", "server.clients_per_round=50"])
    assert info.value.messages == ["partition.clients = 'many': must be an integer"]
    with pytest.raises(ConfigError) as info:
        config.load(str(cfg), ["server.clients_per_round=50"])
    assert info.value.messages == ["server.clients_per_round = 50: must be <= partition.clients (12)"]


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


# -- finding 7: input errors exit 2 naming the input --------------------------------------------------

def test_config_path_that_is_a_folder_binary_or_not_utf8_exits_2(tmp_path, capsys):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("out: caf\xe9\n".encode("latin-1"))
    for path, why in ((tmp_path, "is a folder"), (binary, "binary"), (latin1, "not UTF-8")):
        code, err = cli(capsys, "run", path)
        assert code == EXIT_USAGE and str(path) in err and why in err and "Traceback" not in err, err


def test_yaml_nested_500_levels_exits_2(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("out: " + "[" * 500 + "]" * 500 + "\n")
    code, err = cli(capsys, "run", deep)
    assert code == EXIT_USAGE and "nested deeper than" in err and str(deep) in err


def test_leaf_ragged_or_string_pixels_are_input_errors_naming_the_file(tmp_path):
    for case, mutate in (("ragged", lambda x: x[:1] + [x[1][:100]] + x[2:]),
                         ("string", lambda x: [["0.5"] * 784] + x[1:]),
                         ("nested", lambda x: [[[0.5]] * 784] + x[1:])):
        root = tmp_path / case
        write_leaf(root, "femnist")
        path = root / "train" / "all_data_0_niid_train.json"
        blob = json.loads(path.read_text())
        user = blob["users"][0]
        blob["user_data"][user]["x"] = mutate(blob["user_data"][user]["x"])
        path.write_text(json.dumps(blob))
        with pytest.raises(InputError, match=re.escape(str(path))):
            load_dataset(data_cfg("femnist", root))


@pytest.mark.parametrize("token", ["NaN", "Infinity", "1e999"])
def test_leaf_nan_pixels_are_input_errors_naming_the_file(tmp_path, token):
    write_leaf(tmp_path, "femnist")
    path = tmp_path / "test" / "all_data_1_niid_test.json"
    text = path.read_text()
    first_pixel = re.search(r'"x": \[\[([0-9.e-]+)', text)
    path.write_text(text[:first_pixel.start(1)] + token + text[first_pixel.end(1):])
    with pytest.raises(InputError, match=re.escape(str(path))):
        load_dataset(data_cfg("femnist", tmp_path))


def test_out_that_is_a_file_exits_2_before_any_data_is_loaded(tmp_path):
    taken = tmp_path / "results.txt"
    taken.write_text("not a folder")
    # The data root does not exist: had the data been loaded first, the error would name it instead.
    cfg = write_config(tmp_path / "c.yaml", small_config(taken, data={"name": "cifar10",
                                                                      "root": str(tmp_path / "nowhere")}))
    proc = fedmpi("run", cfg)
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert f"out = '{taken}' is a file" in proc.stderr and "nowhere" not in proc.stderr
    assert taken.read_text() == "not a folder"


def test_read_only_out_exits_2_naming_it(tmp_path):
    place = tmp_path / "ro"
    place.mkdir()
    if os.geteuid() == 0:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(place)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"root cannot be denied by permissions and no read-only mount is allowed: {proc.stderr}")
    else:
        place.chmod(0o500)
    try:
        for out in (place, place / "run"):
            cfg = write_config(tmp_path / "c.yaml", small_config(out, data={"name": "cifar10",
                                                                            "root": str(tmp_path / "nowhere")}))
            proc = fedmpi("run", cfg)
            assert proc.returncode == EXIT_USAGE, proc.stderr
            assert f"out = '{out}'" in proc.stderr
            assert "Read-only file system" in proc.stderr or "Permission denied" in proc.stderr
            assert "Traceback" not in proc.stderr and "nowhere" not in proc.stderr
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(place)], capture_output=True)
        else:
            place.chmod(0o700)


def test_threads_beyond_the_cap_is_a_config_error(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    code, err = cli(capsys, "run", cfg, "runtime.threads=100000", "--dry-run")
    assert code == EXIT_USAGE and "runtime.threads = 100000" in err and str(config.MAX_THREADS) in err
    assert config.load(str(cfg), [f"runtime.threads={config.MAX_THREADS}"]).runtime.threads == config.MAX_THREADS


# -- finding 8: alias bombs and huge values ------------------------------------------------------------

def alias_bomb(levels):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines)


def test_alias_bomb_as_out_is_refused_fast_with_a_short_message(tmp_path, capsys):
    # Seven levels expand to 9^7 = 4.8 million strings (main: a 30 MB error message).
    path = tmp_path / "bomb.yaml"
    path.write_text("seed: 1\nout: &o\n" + "\n".join("  " + line for line in alias_bomb(7).splitlines()) + "\n")
    began = time.monotonic()
    code, err = cli(capsys, "run", path)
    # The message's length is the check; the time only catches a return to expanding 4.8 million strings
    # (main: seconds of work and a 30 MB message), so it is generous for a loaded machine.
    assert time.monotonic() - began < 30.0
    assert code == EXIT_USAGE and "alias" in err and len(err) < 400, err[:500]


def test_aliases_within_the_limit_still_work():
    from fedmpi.config import yamlio

    text = "base: &b {lr: 0.1, batch_size: 5}\nclient: {<<: *b, lr: 0.2}\n"
    assert yamlio.load(text, "t")["client"] == {"lr": 0.2, "batch_size": 5}
    with pytest.raises(ConfigError, match="recursive"):
        yamlio.load("a: &a [1, *a]", "t")


def test_a_huge_bad_value_is_echoed_as_a_short_prefix(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", {**small_config(tmp_path / "out"), "seed": "x" * 1_000_000,
                                             "bogus_" + "k" * 5000: 1})
    code, err = cli(capsys, "run", cfg)
    assert code == EXIT_USAGE and "seed = 'xxx" in err and "must be an integer" in err
    assert "unknown key 'bogus_kkk" in err and len(err) < 1000


# -- finding 10 (config part): non-finite numbers -----------------------------------------------------

@pytest.mark.parametrize("override", ["client.lr=.inf", "client.lr=-.inf", "client.lr=.nan", "server.lr=.nan",
                                      "data.alpha=.nan", "algorithm.name=fedprox", "client.lr=1e400"])
def test_non_finite_floats_are_refused_naming_the_key(tmp_path, override):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    overrides = [override] + (["algorithm.mu=.nan"] if "fedprox" in override else [])
    key = overrides[-1].split("=")[0]
    with pytest.raises(ConfigError) as info:
        config.load(str(cfg), overrides)
    assert any(m.startswith(f"{key} = ") and "not NaN or infinity" in m for m in info.value.messages)


# -- finding 11: YAML 1.1 surprises --------------------------------------------------------------------

def test_documented_words_and_exponent_numbers_mean_what_the_docs_say(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    loaded = config.load(str(cfg), ["runtime.progress=off", "client.vectorize=on", "client.lr=1e-3",
                                    "server.lr=1.0e5"])     # YAML 1.1 read an exponent without a sign as text
    assert loaded.runtime.progress == "off" and loaded.client.vectorize == "on"
    assert loaded.client.lr == 1e-3 and loaded.server.lr == 1e5
    # The same in a file, and only true/false are booleans.
    (tmp_path / "d.yaml").write_text(f"out: {tmp_path / 'o'}\nruntime: {{progress: off}}\nclient: {{lr: 1e-3, "
                                     f"vectorize: on}}\ndata: {{download: yes}}\n")
    with pytest.raises(ConfigError) as info:
        config.load(str(tmp_path / "d.yaml"))
    assert info.value.messages == ["data.download = 'yes': must be true or false"]


def test_stored_configs_keep_strings_that_look_like_numbers(tmp_path):
    """A config written by fedmpi (run.h5, checkpoints) reads back equal, also for out: '1e3' or '010'."""
    for out in ("1e3", "010", "0o10", "on", "null"):
        cfg = config.from_dict({"out": out, "data": {"name": "emnist", "split": "no"}})     # split: read by emnist
        assert config.from_yaml(cfg.to_yaml()) == cfg
        assert yaml.safe_load(cfg.to_yaml())["out"] == out      # YAML 1.1 readers agree


def test_duplicate_keys_are_refused_naming_key_and_lines(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    path.write_text("seed: 1\nclient:\n  lr: 0.1\n  batch_size: 5\n  lr: 0.2\n")
    code, err = cli(capsys, "run", path, "--dry-run")
    assert code == EXIT_USAGE and "duplicate key 'lr' at line 5 (first at line 3)" in err and str(path) in err


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
