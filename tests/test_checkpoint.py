"""Checkpoint files on their own (no training): layout, atomic writing, pruning, checksums, the checks a
--resume makes, the state transport (`gather_states`) and the stop-request flag."""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import ROOT, mpiexec, small_config

import fedmpi
from fedmpi import config
from fedmpi.core.errors import EXIT_PREEMPTED, EXIT_USAGE, ConfigError, InputError
from fedmpi.io import checkpoint, resume
from fedmpi.io.store import RunLog
from fedmpi.mpi import signals
from fedmpi.mpi.local import LocalComm
from fedmpi.mpi.state_codec import decode_state_meta, encode_state


def make_cfg(out, **sections):
    return config.from_dict(small_config(out, **{"rounds": 8, "checkpoint": {"every": 2, "keep": 2}, **sections}))


def client_states(n=4):
    """Client 1 has no state (never trained); the others a vector and a scalar."""
    return {c: ({} if c == 1 else {"c_i": np.full(5, c, dtype=np.float32), "count": np.array(c, dtype=np.int64)})
            for c in range(n)}


def write(cfg, k, states=None, server=None):
    w = checkpoint.CheckpointWriter(cfg, k, wall_s=1.5 * k, world_size=3)
    w.put_server_side({"global": np.arange(10, dtype=np.float32) + k,
                       "server": server if server is not None else {"c": np.ones(3, dtype=np.float32)}})
    for cid, state in (states if states is not None else client_states()).items():
        w.put_client(cid, state)
    return w.commit(cfg.checkpoint.keep)


def make_log(cfg, rows):
    log = RunLog.create(os.path.join(cfg.out, "run.h5"), cfg, 3, ["host"], {})
    for t in range(rows):
        log.append({"round": t, "test_acc": 0.5})
    return log


def layout(path):
    with h5py.File(path, "r", locking=False) as f:
        items = []
        f.visititems(lambda name, obj: items.append((name, getattr(obj, "shape", None))))
        return sorted(items), sorted(f.attrs)


def test_checkpoint_holds_round_vector_states_and_provenance(tmp_path):
    cfg = make_cfg(tmp_path)
    path = write(cfg, 4)
    assert path == os.path.join(tmp_path, "ckpt", "ckpt-4.h5")
    attrs = checkpoint.verify(path)
    assert attrs["round"] == 4 and attrs["wall_s"] == 6.0 and attrs["seed"] == cfg.seed
    assert attrs["fedmpi_version"] == fedmpi.__version__ and attrs["config_hash"] == cfg.hash()
    assert config.from_yaml(attrs["config"]) == cfg and "stateless" in attrs["rng"]
    with h5py.File(path, "r", locking=False) as f:
        assert f["global"].dtype == np.float32 and np.array_equal(f["global"][()], np.arange(10) + 4)
        assert np.array_equal(f["server/c"][()], np.ones(3))
        assert sorted(f["clients"]) == ["0", "2", "3"]          # client 1 had no state
        assert np.array_equal(f["clients/3/c_i"][()], np.full(5, 3)) and f["clients/2/count"][()] == 2
    assert os.listdir(tmp_path / "ckpt") == ["ckpt-4.h5"]      # no temporary file left behind


def test_newest_keep_checkpoints_are_kept(tmp_path):
    cfg = make_cfg(tmp_path)
    for k in (2, 4, 6, 8):
        write(cfg, k)
    assert [r for r, _ in checkpoint.list_checkpoints(tmp_path)] == [8, 6]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["ckpt-6.h5", "ckpt-8.h5"]


def test_checkpoint_due_every_and_at_the_end(tmp_path):
    cfg = config.from_dict(small_config(tmp_path, rounds=8, checkpoint={"every": 3, "keep": 2}))
    assert [k for k in range(1, 9) if checkpoint.due(cfg, k)] == [3, 6, 8]
    never = config.from_dict(small_config(tmp_path, rounds=8, checkpoint={"every": 0, "keep": 2}))
    assert not any(checkpoint.due(never, k) for k in range(1, 9))


def test_truncated_checkpoint_is_damaged(tmp_path):
    path = write(make_cfg(tmp_path), 2)
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)
    with pytest.raises(checkpoint.DamagedCheckpoint, match="unreadable"):
        checkpoint.verify(path)


def test_flipped_data_byte_fails_the_checksum(tmp_path):
    path = write(make_cfg(tmp_path), 2)
    with h5py.File(path, "r", locking=False) as f:
        offset = f["clients/3/c_i"].id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(offset + 1)
        byte = fh.read(1)
        fh.seek(offset + 1)
        fh.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(checkpoint.DamagedCheckpoint, match="checksum mismatch"):
        checkpoint.verify(path)


def test_resume_falls_back_to_previous_checkpoint_and_says_so(tmp_path):
    cfg = make_cfg(tmp_path)
    make_log(cfg, 4)
    write(cfg, 2)
    newest = write(cfg, 4)
    with open(newest, "r+b") as fh:
        fh.truncate(1000)
    said = []
    point = resume.choose(cfg, say=said.append)
    assert (point.round, point.wall_s) == (2, 3.0)
    assert point.damaged and point.damaged[0][0] == newest
    assert any("ckpt-4.h5 is damaged" in s for s in said) and any("ckpt-2.h5" in s for s in said)
    resume.set_aside(point)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["ckpt-2.h5", "ckpt-4.h5.damaged"]


def test_resume_refuses_when_nothing_valid(tmp_path):
    cfg = make_cfg(tmp_path)
    make_log(cfg, 2)
    with pytest.raises(InputError, match="no checkpoint") as e:
        resume.choose(cfg, say=lambda s: None)
    assert e.value.exit_code == EXIT_USAGE
    with open(write(cfg, 2), "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(InputError, match="every checkpoint .* is damaged"):
        resume.choose(cfg, say=lambda s: None)


def test_resume_refuses_another_fedmpi_version(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    make_log(cfg, 2)
    write(cfg, 2)
    written = fedmpi.__version__
    monkeypatch.setattr(fedmpi, "__version__", "99.0")
    with pytest.raises(InputError, match=f"written by fedmpi {re.escape(written)} .*this is fedmpi 99.0") as e:
        resume.choose(cfg, say=lambda s: None)
    assert e.value.exit_code == EXIT_USAGE


def test_resume_refuses_another_config_naming_the_keys(tmp_path):
    cfg = make_cfg(tmp_path)
    make_log(cfg, 2)
    write(cfg, 2)
    other = make_cfg(tmp_path, client={"lr": 0.1, "batch_size": 20, "epochs": 1}, seed=7)
    with pytest.raises(ConfigError) as e:
        resume.choose(other, say=lambda s: None)
    assert "client.lr, seed" in str(e.value) and "checkpoint 0.05, now 0.1" in str(e.value)
    assert e.value.exit_code == EXIT_USAGE
    # Run-time keys may change, out included (a copied run continues elsewhere).
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "ckpt", moved / "ckpt")
    shutil.copy(tmp_path / "run.h5", moved / "run.h5")
    same = config.from_dict(small_config(moved, rounds=20, checkpoint={"every": 5, "keep": 3},
                                         runtime={"threads": 2, "progress": "off"}))
    assert resume.choose(same, say=lambda s: None).round == 2
    with pytest.raises(ConfigError, match="rounds = 1: below the checkpoint's round 2"):
        resume.choose(make_cfg(tmp_path, rounds=1), say=lambda s: None)


def test_resume_needs_the_run_log_with_enough_rows(tmp_path):
    cfg = make_cfg(tmp_path)
    write(cfg, 4)
    with pytest.raises(InputError, match="run.h5 is missing"):
        resume.choose(cfg, say=lambda s: None)
    make_log(cfg, 3)
    with pytest.raises(InputError, match="has 3 rounds, fewer than checkpoint round 4"):
        resume.choose(cfg, say=lambda s: None)


def test_layout_does_not_depend_on_who_wrote_it(tmp_path):
    a, b = make_cfg(tmp_path / "a"), make_cfg(tmp_path / "b")
    wa = checkpoint.CheckpointWriter(a, 2, wall_s=1.0, world_size=1)
    wb = checkpoint.CheckpointWriter(b, 2, wall_s=2.0, world_size=5)
    for w, order in ((wa, [0, 2, 3]), (wb, [3, 0, 2])):
        w.put_server_side({"global": np.zeros(10, dtype=np.float32), "server": {}})
        for cid in order:
            w.put_client(cid, client_states()[cid])
    assert layout(wa.commit(2)) == layout(wb.commit(2))


def test_no_pickle_or_torch_load_in_fedmpi():
    """Loading a file must never run code (docs/explanation/design.md §3): no pickle, torch.load or allow_pickle
    anywhere, except
    the restricted CIFAR batch reader (its find_class allows numpy's array names only; test_hardening.py
    feeds it a malicious batch)."""
    banned = re.compile(r"\bimport pickle\b|\bpickle\.|\bcPickle\b|torch\.load\(|allow_pickle\s*=\s*True|"
                        r"\bimport dill\b|\bjoblib\b")
    restricted = ROOT / "fedmpi" / "data" / "cifar_batches.py"
    allowed = re.compile(r"^import pickle$|pickle\.Unpickler\)|pickle\.UnpicklingError")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "fedmpi").rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if banned.search(line) and not (p == restricted and allowed.search(line.strip()))]
    assert offenders == []


# -- state transport ---------------------------------------------------------------------------------

def varied_state(c):
    """Client c's test state: several dtypes and shapes, an empty array, and no state at all for c == 2."""
    if c == 2:
        return {}
    return {"a": np.arange(c * 3, dtype=np.float32).reshape(c, 3), "b": np.array(c, dtype=np.int64),
            "m": np.arange(4) % 2 == c % 2, "h": np.full((2, 1, 2), c, dtype=np.float16)}


def test_state_encoding_round_trip_and_refusals():
    state = varied_state(3)
    meta, names, arrays = encode_state(state)
    decoded = decode_state_meta(meta, names)
    assert [(n, d, s) for n, d, s in decoded] == [(k, v.dtype, v.shape) for k, v in state.items()]
    assert all(np.array_equal(a, state[k]) for a, k in zip(arrays, state))
    for bad in ({"s": np.array(["text"])}, {"o": np.array([{}], dtype=object)}, {"a/b": np.zeros(1)},
                {"": np.zeros(1)}):
        with pytest.raises(TypeError):
            encode_state(bad)


def test_local_gather_states_in_client_order():
    got = []
    LocalComm().gather_states(np.zeros(5, dtype=int), varied_state, lambda c, s: got.append((c, sorted(s))))
    assert got == [(c, sorted(varied_state(c))) for c in range(5)]


GATHER_SCRIPT = r"""
import sys, traceback
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_checkpoint import varied_state
from fedmpi.mpi.comm import make_comm

comm = make_comm()
try:
    n = 7
    host = np.array([1 + (c * 5) % (comm.size - 1) for c in range(n)])
    got = []

    def get(c):
        assert host[c] == comm.rank, (c, comm.rank)
        return varied_state(c)

    def put(c, state):
        want = varied_state(c)
        assert sorted(state) == sorted(want), (c, sorted(state))
        for k, v in want.items():
            assert state[k].dtype == v.dtype and state[k].shape == v.shape and np.array_equal(state[k], v), (c, k)
        got.append(c)

    comm.gather_states(host, get, put if comm.rank == 0 else None)
    assert comm.rank != 0 or got == list(range(n)), got
    comm.close()
    print(f"gathered ok on rank {comm.rank}", flush=True)
except BaseException:
    traceback.print_exc()
    sys.stdout.flush(); sys.stderr.flush()
    comm.abort(1)
"""


@pytest.mark.mpi
def test_mpi_gather_states_moves_every_state_to_rank_0():
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-c", GATHER_SCRIPT, str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("gathered ok") == 3


# -- stop requests -----------------------------------------------------------------------------------

def test_stop_signal_only_sets_a_flag():
    saved = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    signals.reset()
    try:
        signals.install()
        assert not signals.requested()
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.requested() and signals.received() == "SIGUSR1,SIGTERM"
        stop = signals.stop_error(7, ranks=2)
        assert stop.round == 7 and stop.exit_code == EXIT_PREEMPTED and "after round 7" in str(stop)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        signals.reset()
