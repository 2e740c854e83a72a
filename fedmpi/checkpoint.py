"""Checkpoints `OUT/ckpt/ckpt-<round>.h5` and `--resume` (DESIGN §3, contract); the only module that writes
checkpoint HDF5.

Layout of a checkpoint taken after `round` rounds (the same whatever `-n` wrote it):
  root attributes  round, fedmpi_version, format, config (resolved YAML), config_hash, seed, rng (note),
                   wall_s (training seconds so far), world_size (informational), checksum
  /global          the global flat vector after round `round`'s server update (float32)
  /server/<name>   the algorithm's server state (`Algorithm.server_state`)
  /optimizer/<name>  the server optimizer's state (moments, float64; none for sgd)
  /participation/<name>  the participation provider's state (e.g. the simulated clock), loaded on every rank
  /stage_<stage>/<name>  an upload stage's server state (e.g. stage_privacy: the noise multiplier and the
                   adaptive clip); absent when empty
  /clients/<cid>/<name>  each client's state (`Algorithm.client_state`), clients without state omitted
What rank 0 holds comes from `Experiment.state_dict()`; client states from `Experiment.client_state(cid)`
on the hosting rank, streamed to rank 0 one client at a time.

RNG: fedmpi has no RNG state to save. Every stream is derived from (seed, purpose, round, client)
(`fedmpi.rng`) and torch's global generator is reseeded per client per round, so the round number and
the seed (both stored) restore all randomness. An algorithm with a stateful generator would put it in
its server or client state.

Safety: files are written to a temporary name in the same folder, fsynced and moved into place with
`os.replace`, so a reader never sees half a file; the newest `checkpoint.keep` are kept. The `checksum`
attribute is a SHA-256 over every dataset (path, dtype, shape, bytes) and every other root attribute; a
truncated or damaged file fails to open or fails this check, is reported, and the previous checkpoint is
used. Loading reads arrays and attributes only: no pickle, no `torch.load`, nothing that runs code.
A checkpoint from another fedmpi version or for another config is refused (exit 2).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone

import h5py
import numpy as np

import fedmpi
from fedmpi import config as config_mod
from fedmpi.errors import ConfigError, InputError
from fedmpi.rank0 import decide

FORMAT = 1
NAME = re.compile(r"^ckpt-(\d+)\.h5$")
RNG_NOTE = ("stateless: every random stream is derived from (seed, purpose, round, client) and torch is "
            "reseeded per client per round, so seed and round restore all randomness")


class DamagedCheckpoint(Exception):
    """A checkpoint that cannot be read or fails its checksum."""


# -- where -------------------------------------------------------------------------------------------

def ckpt_dir(out):
    return os.path.join(out, "ckpt")


def ckpt_path(out, round_):
    return os.path.join(ckpt_dir(out), f"ckpt-{round_}.h5")


def list_checkpoints(out):
    """[(round, path)] of the checkpoint files in OUT/ckpt, newest first, by file name. Only the names
    fedmpi writes count (`ckpt-7.h5`, not `ckpt-007.h5`): the other ranks find a chosen checkpoint by
    its round (`ckpt_path`), so a name must map to one round and back."""
    found = []
    for path in glob.glob(os.path.join(ckpt_dir(out), "ckpt-*.h5")):
        m = NAME.match(os.path.basename(path))
        if m and m.group(1) == str(int(m.group(1))):
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def due(cfg, k):
    """Whether a regular checkpoint is written after `k` rounds: every `checkpoint.every`, and at the end."""
    every = cfg.checkpoint.every
    return every > 0 and (k % every == 0 or k == cfg.rounds)


# -- checksum ----------------------------------------------------------------------------------------

def _dataset_digest(path, a):
    h = hashlib.sha256(f"{path}|{a.dtype.str}|{a.shape}|".encode())
    h.update(np.asarray(a, order="C").reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _combine(digests, attrs):
    h = hashlib.sha256()
    for path in sorted(digests):
        h.update(f"D {path} {digests[path]}\n".encode())
    for name in sorted(a for a in attrs if a != "checksum"):
        h.update(f"A {name} {np.asarray(attrs[name]).tolist()!r}\n".encode())
    return h.hexdigest()


def checksum_of(f):
    """Recomputes the checksum of an open checkpoint, reading one dataset at a time."""
    digests = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            digests[name] = _dataset_digest(name, obj[()])

    f.visititems(visit)
    return _combine(digests, dict(f.attrs))


# -- writing (rank 0) --------------------------------------------------------------------------------

class CheckpointWriter:
    """Builds one checkpoint in a temporary file next to its final name; `commit` moves it into place."""

    def __init__(self, cfg, round_, wall_s, world_size):
        self.cfg, self.round = cfg, round_
        self.path = ckpt_path(cfg.out, round_)
        os.makedirs(ckpt_dir(cfg.out), exist_ok=True)
        for stale in glob.glob(os.path.join(ckpt_dir(cfg.out), ".ckpt-*.tmp")):
            os.remove(stale)    # left by a job killed while writing; only one job writes to an out
        self.tmp = os.path.join(ckpt_dir(cfg.out), f".ckpt-{round_}.h5.tmp")
        self.f = h5py.File(self.tmp, "w")
        self.digests = {}
        attrs = {"round": int(round_), "fedmpi_version": fedmpi.__version__, "format": FORMAT,
                 "config": cfg.to_yaml(), "config_hash": cfg.hash(), "seed": int(cfg.seed), "rng": RNG_NOTE,
                 "wall_s": float(wall_s), "world_size": int(world_size),
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self.f.attrs.update(attrs)

    def _put(self, path, value):
        a = np.asarray(value, order="C")
        if a.dtype.kind not in "biuf":
            raise TypeError(f"checkpoint entry {path}: dtype {a.dtype} is not numeric")
        self.f.create_dataset(path, data=a)
        self.digests[path] = _dataset_digest(path, a)

    def put_server_side(self, state):
        """`Experiment.state_dict()`: /global and one group per nested dict (server, optimizer)."""
        for key, value in state.items():
            if isinstance(value, dict):
                for name, a in value.items():
                    self._put(f"{key}/{name}", a)
            else:
                self._put(key, np.asarray(value, dtype=np.float32) if key == "global" else value)

    def put_client(self, cid, state):
        for name, a in state.items():
            self._put(f"clients/{cid}/{name}", a)

    def commit(self, keep):
        """Checksum, close, fsync, rename into place, fsync the folder, prune to the newest `keep`."""
        self.f.attrs["checksum"] = _combine(self.digests, dict(self.f.attrs))
        self.f.close()
        _fsync_path(self.tmp)
        os.replace(self.tmp, self.path)
        _fsync_path(ckpt_dir(self.cfg.out))
        for _, old in list_checkpoints(self.cfg.out)[keep:]:
            os.remove(old)
        return self.path

    def discard(self):
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)


def _fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(exp, round_, wall_s):
    """Collective: every rank calls it at the same round boundary; rank 0 writes the file.

    Consistent by construction: it runs after round `round_ - 1`'s server update (the global vector in
    `exp.x`) and after that round's client training (the client states on their hosts).
    """
    comm = exp.comm
    writer = CheckpointWriter(exp.cfg, round_, wall_s, comm.size) if comm.is_server else None
    try:
        if writer:
            writer.put_server_side(exp.state_dict())
        comm.gather_states(exp.clients.host, exp.client_state, writer.put_client if writer else None)
        return writer.commit(exp.cfg.checkpoint.keep) if writer else None
    except BaseException:
        if writer:
            writer.discard()
        raise


# -- reading -----------------------------------------------------------------------------------------

def verify(path):
    """Root attributes of a readable checkpoint whose checksum holds; DamagedCheckpoint otherwise.
    A checkpoint from another fedmpi version or format is refused with InputError (not damaged: the
    previous checkpoint would be refused too)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            attrs = dict(f.attrs)
            _check_version(path, attrs)
            stored = attrs.get("checksum")
            if stored is None or "global" not in f:
                raise DamagedCheckpoint("incomplete (no checksum or no /global)")
            if checksum_of(f) != stored:
                raise DamagedCheckpoint("checksum mismatch")
            return attrs
    except (DamagedCheckpoint, InputError):
        raise
    except Exception as e:  # noqa: BLE001 - h5py raises OSError, KeyError, ValueError... on damaged files
        raise DamagedCheckpoint(f"unreadable ({type(e).__name__}: {e})") from None


def _check_version(path, attrs):
    version, fmt = attrs.get("fedmpi_version"), attrs.get("format")
    if version is None or fmt is None:
        raise DamagedCheckpoint("no fedmpi_version/format attribute")
    if version != fedmpi.__version__ or int(fmt) != FORMAT:
        raise InputError(f"checkpoint {path} was written by fedmpi {version} (format {fmt}); this is fedmpi "
                         f"{fedmpi.__version__} (format {FORMAT}): continue that run with the version that "
                         f"wrote it, or start a new run")


def _check_config(path, attrs, cfg):
    try:
        stored = config_mod.from_yaml(attrs["config"])
    except (ConfigError, KeyError) as e:
        raise InputError(f"checkpoint {path}: its stored config cannot be read ({e})") from None
    differ = config_mod.differing_keys(stored, cfg)
    if differ:
        flat_s, flat_c = _flat(stored.to_dict()), _flat(cfg.to_dict())
        lines = [f"{k}: checkpoint {flat_s.get(k)!r}, now {flat_c.get(k)!r}" for k in differ]
        raise ConfigError([f"--resume: the config differs from the one checkpoint {path} was written with, in "
                           f"{', '.join(differ)}; only rounds, out, checkpoint.* and runtime.* may change"]
                          + ["  " + line for line in lines])
    if attrs.get("config_hash") != cfg.hash():
        raise ConfigError(f"--resume: checkpoint {path} has config hash {attrs.get('config_hash')}, this config "
                          f"has {cfg.hash()}; it was written for another config")
    if int(attrs["round"]) > cfg.rounds:
        raise ConfigError(f"rounds = {cfg.rounds}: below the checkpoint's round {int(attrs['round'])} ({path}); "
                          f"rounds may grow on --resume, not shrink")
    moving = [key for key, sched in (("client.lr_schedule", cfg.client.lr_schedule),
                                     ("server.lr_schedule", cfg.server.lr_schedule)) if sched.depends_on_run_length]
    if moving and stored.rounds != cfg.rounds:
        raise ConfigError(f"rounds = {cfg.rounds}: the checkpoint's run has {stored.rounds}, and {', '.join(moving)} "
                          f"(cosine with rounds: null) takes its horizon from it, so the rates already used would "
                          f"change; keep rounds = {stored.rounds}, or set the schedule's rounds explicitly")


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        out.update(_flat(v, key) if isinstance(v, dict) else {key: v})
    return out


@dataclass
class ResumePoint:
    round: int
    path: str
    wall_s: float = 0.0
    damaged: list = field(default_factory=list)     # [(path, reason)] newer checkpoints that were skipped


def choose(cfg, say=None):
    """Rank 0: the newest valid checkpoint in cfg.out, checked against this config and run.h5.

    Damaged newer checkpoints are reported through `say` and skipped. Raises InputError/ConfigError
    (exit 2) when there is nothing valid to resume or the config differs; nothing is modified here.
    """
    say = say or (lambda text: print(f"fedmpi: {text}", file=sys.stderr, flush=True))
    found = list_checkpoints(cfg.out)
    if not found:
        raise InputError(f"--resume: no checkpoint in {ckpt_dir(cfg.out)}; nothing to continue (start a new run "
                         f"without --resume, or with --overwrite to replace {cfg.out})")
    damaged = []
    for round_, path in found:
        try:
            attrs = verify(path)
            _check_round(attrs, round_)
        except DamagedCheckpoint as e:
            damaged.append((path, str(e)))
            say(f"checkpoint {path} is damaged ({e}); trying the previous one")
            continue
        _check_config(path, attrs, cfg)
        _check_run_log(cfg, round_)
        if damaged:
            say(f"resuming from {path} (round {round_}) instead of the damaged newer checkpoint(s)")
        return ResumePoint(round_, path, float(attrs["wall_s"]), damaged)
    raise InputError(f"--resume: every checkpoint in {ckpt_dir(cfg.out)} is damaged "
                     f"({'; '.join(f'{os.path.basename(p)}: {r}' for p, r in damaged)}); nothing to continue")


def _check_round(attrs, round_):
    """A checkpoint whose `round` attribute disagrees with its file name (renamed or copied by hand) is not
    trusted: resuming from it would start at the wrong round and its state would not match run.h5."""
    try:
        stored = int(attrs["round"])
    except (KeyError, TypeError, ValueError):
        raise DamagedCheckpoint("no readable round attribute") from None
    if stored != round_:
        raise DamagedCheckpoint(f"its round attribute is {stored} but its file name says round {round_}")


def _check_run_log(cfg, round_):
    from fedmpi.store import open_run

    path = os.path.join(cfg.out, "run.h5")
    if not os.path.exists(path):
        raise InputError(f"--resume: {path} is missing; a run is continued together with its log")
    try:
        with open_run(path) as f:
            rows, run_hash = f["metrics/round"].shape[0], f.attrs.get("config_hash")
    except (OSError, KeyError) as e:
        raise InputError(f"--resume: {path} cannot be read ({e})") from None
    if run_hash != cfg.hash():
        raise InputError(f"--resume: {path} was written for another config (hash {run_hash}, this config "
                         f"{cfg.hash()})")
    if rows < round_:
        raise InputError(f"--resume: {path} has {rows} rounds, fewer than checkpoint round {round_}")


def plan_resume(cfg, comm):
    """Collective: rank 0 picks and checks the checkpoint, every rank learns the outcome.

    On refusal rank 0 raises the error (the CLI prints it) and the other ranks raise Refused with
    the same exit code and no message, so the job prints one message and exits 2 everywhere.
    """
    def judge():
        point = choose(cfg)
        return point, point.round

    point, round_ = decide(comm, judge)
    return point or ResumePoint(int(round_), ckpt_path(cfg.out, int(round_)))


def load_into(exp, point) -> int:
    """Every rank: restores what it holds from the checkpoint (rank 0 verified it in `plan_resume`) and
    returns the round the run continues from.

    Each worker reads its own clients' states from the file itself (read-only, no HDF5 locking) instead
    of rank 0 reading everything and sending it on: no message per client, no single rank holding or
    reading all states, and reads spread over the workers, which suits parallel file systems; the
    placement is recomputed for this run's `-n`, so any `-n` can continue any checkpoint.
    """
    with h5py.File(point.path, "r", locking=False) as f:
        # Every rank plans rounds itself, so the participation state (e.g. the simulated clock) goes to all.
        participation = _read_group(f.get("participation"))
        if exp.comm.is_server:
            x = f["global"][()]
            if x.shape != (exp.flat.dim,):
                raise InputError(f"checkpoint {point.path}: /global has {x.shape[0]} entries, the model {exp.flat.dim}")
            groups = {name: _read_group(g) for name, g in f.items() if isinstance(g, h5py.Group) and name != "clients"}
            exp.load_state_dict({**groups, "global": x, "participation": participation})
        else:
            exp.participation.load_state(participation)
        clients = f.get("clients")
        for cid in sorted(exp.clients.mine):
            if clients is not None and str(cid) in clients:
                exp.load_client_state(cid, _read_group(clients[str(cid)]))
    return point.round


def _read_group(group):
    return {} if group is None else {name: ds[()] for name, ds in group.items()}


def set_aside(point):
    """Renames the damaged checkpoints skipped by `choose` to *.damaged, so they are kept for inspection
    but never chosen or counted again (called once the resume really starts)."""
    for path, _ in point.damaged:
        if os.path.exists(path):
            os.replace(path, path + ".damaged")
