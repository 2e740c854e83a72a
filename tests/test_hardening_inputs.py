"""Issue 29, finding 6 (config and data inputs): what raised a traceback exits 2 naming the key, the line or the
file. Finding 7 (keys that change nothing in the chosen form are refused) is tests/test_hardening_no_effect.py.
All in one process: every case is refused while the config is read or the data loaded, before MPI."""

from __future__ import annotations

import json
import pickle
import re

import h5py
import numpy as np
import pytest
from conftest import run_steps, small_config, write_config
from dataset_files import write_cifar, write_leaf

from fedmpi import config
from fedmpi.cli import main
from fedmpi.core.errors import EXIT_USAGE, ConfigError, InputError
from fedmpi.data import load_dataset
from fedmpi.data.cifar_batches import read_cifar_batch
from fedmpi.io import checkpoint
from fedmpi.mpi.runtime import parse_bytes
from fedmpi.privacy.keys import MAX_NOISE, MIN_NOISE


def cli(capsys, *args):
    """fedmpi's CLI in this process, --dry-run (nothing is run or written): (exit code, stderr)."""
    code = main([str(a) for a in args] + ["--dry-run"])
    return code, capsys.readouterr().err


def refused(capsys, tmp_path, text, *overrides):
    """stderr of `fedmpi run` on a config of `text`, asserting exit 2 and no traceback."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    code, err = cli(capsys, "run", path, *overrides)
    assert code == EXIT_USAGE and "Traceback" not in err, err
    return err


def problems(mapping):
    """The messages of the ConfigError that `mapping` raises."""
    with pytest.raises(ConfigError) as info:
        config.from_dict(mapping)
    return info.value.messages


# -- finding 6: tracebacks become exit 2 naming the key, line or file -----------------------------------------

@pytest.mark.parametrize("text, named", [
    ("seed: !!int abc\n", "!!int 'abc' is not a valid !!int value"),
    ("seed: !!float x\n", "!!float 'x' is not a valid !!float value"),
    ("out: !!timestamp bad\n", "!!timestamp 'bad' is not a valid !!timestamp value"),
    ("out: !!binary '!!!'\n", "out = b''"),            # valid base64 of nothing: a value of the wrong type
    ("out: !!binary 'a'\n", "failed to decode base64 data"),
    ("out: !foo bar\n", "could not determine a constructor for the tag '!foo'"),
])
def test_bad_explicit_yaml_tags_exit_2_naming_the_line(capsys, tmp_path, text, named):
    err = refused(capsys, tmp_path, text)
    assert named in err and ("line 1" in err or named.startswith("out =")), err


def test_integers_beyond_the_text_limit_exit_2(capsys, tmp_path):
    # Python refuses int('9' * 4301) with ValueError; the loader refuses long literals itself, naming the line.
    err = refused(capsys, tmp_path, "rounds: 3\nseed: " + "9" * 5000 + "\n")
    assert "an integer of 5000 digits" in err and "line 2" in err
    # An override of one such number too, and a huge integer given through the API names its key.
    err = refused(capsys, tmp_path, "rounds: 3\n", "partition.clients=" + "7" * 4400)
    assert "override 'partition.clients'" in err and "4400 digits" in err
    assert any(m.startswith("seed = <an integer of") for m in problems({"seed": 10 ** 5000}))


@pytest.mark.parametrize("seed, ok", [(2 ** 64, False), (2 ** 63, False), (2 ** 63 - 1, True), (-1, False)])
def test_seed_is_bounded_by_what_run_h5_stores(seed, ok):
    # A seed >= 2^64 was accepted, then failed at the first checkpoint (an HDF5 64-bit attribute).
    if ok:
        assert config.from_dict({"seed": seed}).seed == seed
    else:
        assert any(m.startswith(f"seed = {seed}:") and "2^63" in m for m in problems({"seed": seed}))


@pytest.mark.mpi
def test_the_largest_seed_runs_through_checkpoints_and_resume(tmp_path):
    # One launch: a run with seed 2^63 - 1 writes its checkpoints (where 2^64 failed) and resumes from them.
    out = tmp_path / "run"
    path = write_config(tmp_path / "c.yaml", small_config(out, seed=2 ** 63 - 1, rounds=2,
                                                          checkpoint={"every": 1, "keep": 2}))
    run_steps(2, [[path], [path, "--resume", "rounds=3"]])
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "finished" and f["metrics/round"].shape[0] == 3
    rounds = sorted(r for r, _ in checkpoint.list_checkpoints(out))
    with h5py.File(checkpoint.ckpt_path(out, rounds[-1]), "r", locking=False) as f:
        assert rounds[-1] == 3 and int(f.attrs["seed"]) == 2 ** 63 - 1


def test_every_integer_key_is_bounded_to_64_bits():
    messages = problems({"rounds": 2 ** 70, "partition": {"clients": 10 ** 30}, "eval": {"every": -(2 ** 64)}})
    assert {m.split(" = ")[0] for m in messages} == {"rounds", "partition.clients", "eval.every"}
    assert all("within 64 bits" in m for m in messages)


@pytest.mark.parametrize("escaped, code", [(r"\x01", "U+0001"), (r"\0", "U+0000"), (r"\x1b", "U+001B"),
                                          (r"\x7f", "U+007F"), (r"\x85", "U+0085"), (r"\ud800", "U+D800"),
                                          (r"\r", "U+000D")])
def test_control_characters_in_strings_are_refused_naming_the_key(capsys, tmp_path, escaped, code):
    # In the file (as a YAML escape) and in an override; a NUL in `out` is cut off or refused by the OS later.
    err = refused(capsys, tmp_path, f'rounds: 1\nout: "runs/a{escaped}b"\n')
    assert "config error: out = " in err and code in err, err
    err = refused(capsys, tmp_path, "rounds: 1\n", f'data.root="d{escaped}"')
    assert "data.root = " in err and code in err, err


def test_raw_control_characters_in_a_config_file_exit_2_naming_the_line(capsys, tmp_path):
    err = refused(capsys, tmp_path, "rounds: 1\nout: runs/a\x01b\n")
    assert "character U+0001 at line 2" in err, err


def test_tab_and_newline_stay_allowed_in_strings():
    assert config.from_dict({"out": "runs/a\tb"}).out == "runs/a\tb"
    assert config.from_dict({"out": "runs/a\nb"}).out == "runs/a\nb"


@pytest.mark.parametrize("z", [1e300, 1e-300, -1.0, MAX_NOISE * 2, MIN_NOISE / 2])
def test_noise_multiplier_is_bounded_to_a_sane_range(z):
    # 1e300 overflowed the accountant (OverflowError), 1e-300 divided by zero in it.
    messages = problems({"privacy": {"mechanism": "gaussian", "noise_multiplier": z}})
    assert any(m.startswith("privacy.noise_multiplier = ") and f"[{MIN_NOISE:g}, {MAX_NOISE:g}]" in m
               for m in messages), messages


def test_noise_multiplier_range_allows_zero_and_its_ends_and_pld_takes_more_noise():
    for z in (0.0, MIN_NOISE, 1.0, MAX_NOISE):
        assert config.from_dict({"privacy": {"mechanism": "gaussian", "noise_multiplier": z}})
    messages = problems({"privacy": {"mechanism": "gaussian", "noise_multiplier": 0.1, "accountant": "pld"},
                         "server": {"sampling": "poisson"}})
    assert any("privacy.noise_multiplier = 0.1" in m and "[0.3, " in m for m in messages), messages
    assert any("privacy.target_epsilon = 1e-300" in m for m in problems(
        {"privacy": {"mechanism": "gaussian", "target_epsilon": 1e-300}}))
    assert any("privacy.clip_lr = 1e+300" in m for m in problems(
        {"privacy": {"mechanism": "gaussian", "adaptive_clip": True, "clip_lr": 1e300}}))


@pytest.mark.parametrize("accountant, sampling, target, named", [
    ("rdp", "fixed", 0.01, "not reached after 10 rounds even with the largest noise multiplier allowed"),
    ("pld", "poisson", 1000.0, "under the 0.3 the pld accountant takes"),
])
def test_target_epsilon_outside_what_the_noise_range_reaches_is_refused_quickly(accountant, sampling, target, named):
    # 1e-300 searched for 26 s and picked z = 1.3e6; the pld search at small z built grids of gigabytes.
    pytest.importorskip("dp_accounting")
    from fedmpi.privacy.accounting import Sampling
    from fedmpi.privacy.keys import PrivacyConfig
    from fedmpi.privacy.plan import resolve

    privacy = PrivacyConfig(mechanism="gaussian", target_epsilon=target, accountant=accountant)
    with pytest.raises(ConfigError, match=f"privacy.target_epsilon = {target:g}: .*{named}"):
        resolve(privacy, Sampling(sampling, 30, 10), 10)


def test_client_state_memory_is_bounded(capsys, tmp_path):
    # 400 digits overflowed float() to infinity, then int(inf) raised OverflowError.
    err = refused(capsys, tmp_path, "rounds: 1\nruntime: {client_state_memory: '" + "9" * 400 + "'}\n")
    assert "runtime.client_state_memory = " in err and "at most" in err, err
    with pytest.raises(ValueError, match="at most"):
        parse_bytes(2 ** 63)
    assert parse_bytes("1.5 kB") == 1500 and parse_bytes("4GiB") == 4 << 30 and parse_bytes(2 ** 63 - 1)


@pytest.mark.parametrize("override, named", [
    ("rounds=1e400", "rounds = inf: must be an integer"),
    ("partition.clients=1e400", "partition.clients = inf: must be an integer"),
    ("client.lr=1e999", "client.lr = inf: must be a number (not NaN or infinity)"),
    ("client=[1, 2]", "client = [1, 2]: must be a mapping of keys"),
])
def test_huge_numbers_and_wrong_shapes_in_overrides_exit_2(capsys, tmp_path, override, named):
    err = refused(capsys, tmp_path, "rounds: 1\n", override)
    assert named in err, err


def test_alias_to_a_scalar_where_a_section_belongs_exits_2(capsys, tmp_path):
    err = refused(capsys, tmp_path, "seed: &s 3\nrounds: 1\nclient: *s\nserver: {<<: *s}\n")
    assert "expected a mapping or list of mappings for merging" in err, err
    err = refused(capsys, tmp_path, "seed: &s 3\nrounds: 1\nclient: *s\n")
    assert "client = 3: must be a mapping of keys" in err, err


def leaf_file(root, kind):
    write_leaf(root, kind)
    path = root / "train" / "all_data_0_niid_train.json"
    return path, json.loads(path.read_text())


def leaf_cfg(name, root):
    return config.from_dict({"data": {"name": name, "root": str(root)}, "partition": {"clients": 3, "scheme": "iid"},
                             "server": {"clients_per_round": 1}})


def test_shakespeare_lone_surrogate_is_an_input_error_naming_file_and_user(tmp_path):
    path, blob = leaf_file(tmp_path, "shakespeare")
    user = blob["users"][1]
    x = blob["user_data"][user]["x"]
    x[2] = x[2][:40] + "\ud800" + x[2][41:]
    path.write_text(json.dumps(blob))           # json writes the lone surrogate as the escape \ud800
    assert "\\ud800" in path.read_text()
    with pytest.raises(InputError, match=re.escape(f"{path}: user '{user}', sample 2: its input 'x' holds a lone "
                                                   f"surrogate")):
        load_dataset(leaf_cfg("shakespeare", tmp_path))


def test_leaf_booleans_among_pixels_or_labels_are_input_errors_naming_file_user_sample(tmp_path):
    for case, where, kind in (("pixel", "x", "input 'x'"), ("label", "y", "label 'y'")):
        root = tmp_path / case
        path, blob = leaf_file(root, "femnist")
        user = blob["users"][0]
        values = blob["user_data"][user][where]
        if where == "x":
            values[3][100] = True           # read by numpy as the pixel value 1.0, silently
        else:
            values[3] = False               # the label 0
        path.write_text(json.dumps(blob))
        with pytest.raises(InputError, match=re.escape(f"{path}: user '{user}', sample 3: its {kind} holds "
                                                       f"true/false")):
            load_dataset(leaf_cfg("femnist", root))


def test_leaf_user_named_true_is_still_read(tmp_path):
    path, blob = leaf_file(tmp_path, "femnist")
    blob["users"][0], old = "true_false", blob["users"][0]
    blob["user_data"]["true_false"] = blob["user_data"].pop(old)
    path.write_text(json.dumps(blob))
    assert load_dataset(leaf_cfg("femnist", tmp_path)).x_train.shape[1:] == (1, 28, 28)


class _Call:
    """Pickles as `func(*args)`, without a BUILD (state) unless `state` is given: how a crafted batch is built."""

    def __init__(self, func, args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]


@pytest.mark.parametrize("case, data", [
    ("reconstruct without data", _Call(RECONSTRUCT, (np.ndarray, (10000, 3072), b"B"))),
    ("ndarray called directly", _Call(np.ndarray, ((10000, 3072), "B"))),
    ("short data", _Call(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (10000, 3072), np.dtype(np.uint8), False,
                                                                 b"\x00" * 100))),
    ("data as a list", _Call(RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (2, 3072), np.dtype(np.uint8), False,
                                                                     [0] * 6144))),
])
def test_cifar_batch_arrays_without_their_bytes_are_refused(tmp_path, case, data):
    # A few hundred bytes that made an uninitialised 10000 x 3072 array whose "pixels" loaded silently.
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": data, "labels": [0]}, protocol=2))
    with pytest.raises(InputError, match=re.escape(f"{path}: not a CIFAR python batch")):
        read_cifar_batch(str(path), "labels")


def test_cifar_batches_written_by_numpy_still_load(tmp_path):
    written = write_cifar(tmp_path, "cifar10", n_train=20, n_test=5)
    folder = tmp_path / "cifar-10-batches-py"
    images, labels = read_cifar_batch(str(folder / "test_batch"), "labels")
    assert images.shape == (5, 3, 32, 32) and images.flags.writeable
    assert np.array_equal(images.transpose(0, 2, 3, 1), written["test"][0]) and list(labels) == list(range(5))
    for protocol in (2, 5):
        path = tmp_path / f"p{protocol}"
        rows = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
        path.write_bytes(pickle.dumps({"data": rows, "labels": [1, 2]}, protocol=protocol))
        assert np.array_equal(read_cifar_batch(str(path), "labels")[0].reshape(2, 3072), rows)
