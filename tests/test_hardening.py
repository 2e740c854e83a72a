"""Issue 17, tried as a hostile or careless user would: no data file runs code, a full disk costs no finished
round, every bad input exits 2 naming the key or file, YAML means what the docs say. One test (or a few)
per finding; the full disk, the lock and the files on disk are in test_hardening_disk.py, the MPI cases in
test_hardening_mpi.py."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import time

import numpy as np
import pytest
import yaml
from conftest import ROOT, fedmpi_cmd, small_config, write_config
from dataset_files import write_cifar, write_leaf

from fedmpi import config
from fedmpi.cli import main
from fedmpi.core.errors import EXIT_USAGE, ConfigError, InputError
from fedmpi.data import load_dataset

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

