"""Issue 38: every loaded personal or cluster state is checked before anything is reopened. Generated over the
registry: every algorithm that keeps state per client (its `ClientVectors`, its personal entries, or client
state of its own) runs two tiny rounds in this process with a checkpoint; then copies of that checkpoint,
tampered with and their checksums recomputed, are resumed, and each must be refused (exit 2, one line
naming the checkpoint, the dataset and what was expected) before run.h5 is touched:
  - NaN in each float entry a client stored (Ditto's v, APFL's v, v̄ and alpha, the personal heads, IFCA's
    cluster choice, SCAFFOLD's c_i, ...);
  - an extra client group, for a client that does not exist in this run;
and the untouched checkpoint still resumes. Beside them, on one algorithm each: a missing client group, a
removed entry, a manifest that names a client beyond the run, and declared bounds (APFL's alpha in [0, 1],
IFCA's cluster a whole index below k). Every declared client vector must appear in its algorithm's
checkpoint, so a vector no tiny run ever stores would fail here rather than go untested."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
from conftest import small_config, write_config

from fedmpi import config
from fedmpi.algorithms import declares_personal_split
from fedmpi.algorithms.base import Algorithm
from fedmpi.algorithms.registry import REGISTRY
from fedmpi.cli import main
from fedmpi.io import checkpoint
from fedmpi.io.checkpoint_checks import client_expectations
from fedmpi.mpi.local import LocalComm
from fedmpi.run.setup import experiment

CLIENTS, ROUNDS = 6, 2
SERVER_SET = {"server_data": {"size": 30, "source": "holdout", "holdout": 30}}
# What an algorithm needs beside its name to run, or to store each of its vectors in two rounds.
EXTRA = {
    "fedbn": {"model": {"name": "mlp", "hidden": 8, "mlp_norm": "batch"}},
    "moon": {"model": {"name": "simple_cnn", "projection": 8}},
    "safl": {**SERVER_SET, "algorithm": {"name": "safl", "gating": True, "nu": 2.0, "mix": "end_of_round"}},   # w too
    "fsl": SERVER_SET,
    "datashare": SERVER_SET,
    "fedbuff": {"algorithm": {"name": "fedbuff", "concurrency": 6, "buffer_size": 2}},   # updates held at the end
    "fedskip": {"algorithm": {"name": "fedskip", "delta": 4}},
    "apfl": {"algorithm": {"name": "apfl", "adaptive": True}},
    "ifca": {"algorithm": {"name": "ifca", "k": 2}},
    "fedsa_lora": {"model": {"name": "lora_nets:TinyLora"}},     # personal B needs LoRA adapters (tests/lora_nets.py)
}


def keeps_client_state(cls):
    return bool(cls.keeps_client_state or declares_personal_split(cls)
                or cls.client_state is not Algorithm.client_state)


STATEFUL = sorted(name for name, cls in REGISTRY.items() if keeps_client_state(cls))


def _config(out, name):
    cfg = small_config(out, rounds=ROUNDS, algorithm={"name": name}, checkpoint={"every": ROUNDS, "keep": 1},
                       partition={"clients": CLIENTS, "scheme": "iid"}, server={"clients_per_round": 4},
                       model={"name": "mlp", "hidden": 8}, client={"lr": 0.05, "batch_size": 20, "steps": 2})
    for key, value in EXTRA.get(name, {}).items():
        # another model replaces the mlp's section (its width is no key of a plug-in)
        other_model = key == "model" and value.get("name", "mlp") != "mlp"
        cfg[key] = dict(value) if other_model else {**cfg.get(key, {}), **value}
    return cfg


_RUNS = {}


def parent(name, tmp_path_factory):
    """(config mapping, out, checkpoint path, declared client vector names) of the algorithm's two-round run."""
    if name not in _RUNS:
        base = tmp_path_factory.mktemp(name)
        cfg = _config(base / "out", name)
        assert main(["run", str(write_config(base / "c.yaml", cfg))]) == 0
        declared = set(client_expectations(experiment(config.from_dict(cfg), LocalComm())))
        _RUNS[name] = cfg, base / "out", checkpoint.list_checkpoints(str(base / "out"))[0][1], declared
    return _RUNS[name]


def first_client(path, entry):
    """The lowest client id whose stored state has `entry`."""
    return min((cid for cid, e in stored_entries(path) if e == entry), key=int)


def stored_entries(path):
    with h5py.File(path, "r", locking=False) as f:
        clients = f["clients"]
        return {(cid, entry): clients[cid][entry].dtype.kind for cid in clients for entry in clients[cid]}


def resume_copy(name, tmp_path_factory, tmp_path, edit):
    """Exit code of resuming a copy of the algorithm's run whose checkpoint `edit(f)` changed (checksum
    recomputed), and whether run.h5 was left byte for byte as it was."""
    cfg, out, path, _ = parent(name, tmp_path_factory)
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    ckpt = copy / "ckpt" / path.rsplit("/", 1)[-1]
    with h5py.File(ckpt, "r+", locking=False) as f:
        edit(f)
        f.attrs["checksum"] = checkpoint.checksum_of(f)
    log = (copy / "run.h5").read_bytes()
    code = main(["run", str(write_config(tmp_path / "c.yaml", {**cfg, "out": str(copy)})), f"rounds={ROUNDS + 1}",
                 "--resume"])
    return code, (copy / "run.h5").read_bytes() == log, str(ckpt)


def refused_line(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedmpi: error")]
    assert len(err) == 1, err
    return err[0]


def set_value(where, value, index=0):
    def edit(f):
        a = f[where][()]
        a.reshape(-1)[index] = value
        del f[where]
        f[where] = a
    return edit


def test_the_registry_has_the_stateful_algorithms_it_is_known_to_have():
    assert {"ditto", "apfl", "ifca", "scaffold", "fedper", "fedrep", "lgfedavg", "fedbn", "local"} <= set(STATEFUL)


@pytest.mark.parametrize("name", STATEFUL)
def test_every_declared_client_vector_is_stored_by_the_tiny_run(name, tmp_path_factory):
    _, _, path, declared = parent(name, tmp_path_factory)
    assert declared <= {entry for _, entry in stored_entries(path)}, name


@pytest.mark.parametrize("name", STATEFUL)
def test_nan_in_each_stored_client_entry_is_refused_before_run_h5_is_touched(name, tmp_path_factory, tmp_path,
                                                                             capsys):
    _, _, path, _ = parent(name, tmp_path_factory)
    entries = stored_entries(path)
    floats = sorted({entry for (_, entry), kind in entries.items() if kind == "f"})
    assert floats, f"{name}'s checkpoint holds no float client state"
    for entry in floats:
        cid = first_client(path, entry)
        case = tmp_path / entry
        case.mkdir()
        code, untouched, ckpt = resume_copy(name, tmp_path_factory, case, set_value(f"clients/{cid}/{entry}", np.nan))
        line = refused_line(capsys)
        assert code == 2 and untouched, (name, entry, line)
        assert f"checkpoint {ckpt}: /clients/{cid}/{entry}" in line and "non-finite" in line, line
        assert "expected finite numbers" in line


@pytest.mark.parametrize("name", STATEFUL)
def test_an_extra_client_group_is_refused_and_the_untouched_checkpoint_resumes(name, tmp_path_factory, tmp_path,
                                                                               capsys):
    def extra(f):
        f.copy(f["clients"][sorted(f["clients"], key=int)[0]], f"clients/{CLIENTS}")

    (tmp_path / "extra").mkdir()
    code, untouched, ckpt = resume_copy(name, tmp_path_factory, tmp_path / "extra", extra)
    line = refused_line(capsys)
    assert code == 2 and untouched
    assert f"checkpoint {ckpt}: /clients/{CLIENTS} is the state of a client that does not exist" in line
    assert f"expected client ids 0..{CLIENTS - 1}" in line
    (tmp_path / "good").mkdir()
    assert resume_copy(name, tmp_path_factory, tmp_path / "good", lambda f: None)[0] == 0


def _without(where):
    def edit(f):
        del f[where]
    return edit


def _manifest_names(cid):
    def edit(f):
        ids = f["manifest/clients"][()]
        ids[-1] = cid
        del f["manifest/clients"]
        f["manifest/clients"] = ids
    return edit


@pytest.mark.parametrize("case", ["missing group", "no manifest", "manifest beyond the run"])
def test_client_groups_must_match_the_manifest(case, tmp_path_factory, tmp_path, capsys):
    cid = first_client(parent("ditto", tmp_path_factory)[2], "v")
    edit, named = {
        "missing group": (_without(f"clients/{cid}"), f"/clients/{cid} is missing; expected 1 entries, as /manifest "
                                                      f"lists"),
        "no manifest": (_without("manifest"), "/manifest is missing or incomplete"),
        "manifest beyond the run": (_manifest_names(CLIENTS + 3), f"/manifest/clients names client {CLIENTS + 3}; "
                                                                  f"expected ids of this run's {CLIENTS} clients"),
    }[case]
    code, untouched, _ = resume_copy("ditto", tmp_path_factory, tmp_path, edit)
    line = refused_line(capsys)
    assert code == 2 and untouched and named in line, line


def test_a_removed_entry_is_refused(tmp_path_factory, tmp_path, capsys):
    cid = first_client(parent("apfl", tmp_path_factory)[2], "alpha")
    code, untouched, _ = resume_copy("apfl", tmp_path_factory, tmp_path, _without(f"clients/{cid}/alpha"))
    line = refused_line(capsys)
    assert code == 2 and untouched and f"/clients/{cid} has 2 entries; expected 3 entries" in line, line


@pytest.mark.parametrize("name, entry, value, expected", [
    ("apfl", "alpha", 1.5, "expected values in [0.0, 1.0]"),
    ("apfl", "alpha", -0.25, "expected values in [0.0, 1.0]"),
    ("ifca", "cluster", 2.0, "expected whole numbers in [0, 1]"),
    ("ifca", "cluster", 0.5, "expected whole numbers in [0, 1]"),
])
def test_declared_bounds_are_refused_when_broken(name, entry, value, expected, tmp_path_factory, tmp_path, capsys):
    cid = first_client(parent(name, tmp_path_factory)[2], entry)
    code, untouched, _ = resume_copy(name, tmp_path_factory, tmp_path, set_value(f"clients/{cid}/{entry}", value))
    line = refused_line(capsys)
    assert code == 2 and untouched and f"/clients/{cid}/{entry}" in line and expected in line, line
