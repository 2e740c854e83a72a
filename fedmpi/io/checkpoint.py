"""Checkpoints `OUT/ckpt/ckpt-<round>.h5` and `--resume` (docs/design.md §3, contract); the only module that writes
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
(`fedmpi.core.rng`) and torch's global generator is reseeded per client per round, so the round number and
the seed (both stored) restore all randomness. An algorithm with a stateful generator would put it in
its server or client state.

Safety: files are written to a unique temporary name in the same folder (created with O_EXCL |
O_NOFOLLOW, so a planted file or symlink is never written through), fsynced and moved into place with
`os.replace`, so a reader never sees half a file; the newest `checkpoint.keep` are kept. The `checksum`
attribute is a SHA-256 over every dataset (path, dtype, shape, bytes) and every other root attribute; a
truncated or damaged file fails to open or fails this check, is reported, and the previous checkpoint is
used. Loading reads arrays and attributes only: no pickle, no `torch.load`, nothing that runs code; the
stored config is compared as YAML data, so nothing it names (a `module:Class` plug-in) is imported.
A checkpoint from another fedmpi version or for another config is refused (exit 2), and so is one whose
checksum holds but whose contents do not fit this run (`fedmpi.io.checkpoint_checks`: shapes, dtypes,
finiteness, attribute types), before run.h5 is reopened and before anything is loaded.
"""

from __future__ import annotations

import glob
import hashlib
import numbers
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone

import h5py
import numpy as np

import fedmpi
from fedmpi import config as config_mod
from fedmpi.core.errors import EXIT_FAILED, ConfigError, FedmpiError, InputError, Refused, report_lines
from fedmpi.io import checkpoint_checks as checks
from fedmpi.io.rank0 import decide
from fedmpi.io.store import open_run

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
        self.tmp, self.f = _create_temporary(ckpt_dir(cfg.out), round_)
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


def _create_temporary(folder, round_):
    """(path, open h5py.File) of a new file under a unique name in `folder`: created with O_EXCL | O_NOFOLLOW
    (never a file or symlink planted under that name), and the file HDF5 opened is checked to be the one
    created (same device and inode), so nothing a symlink points to is ever truncated."""
    tmp = os.path.join(folder, f".ckpt-{round_}-{os.getpid()}-{secrets.token_hex(4)}.h5.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        created = os.fstat(fd)
        f = h5py.File(tmp, "w")
        opened = os.fstat(f.id.get_vfd_handle())
        if (opened.st_dev, opened.st_ino) != (created.st_dev, created.st_ino):
            f.close()
            raise InputError(f"checkpoint temporary file {tmp} was replaced while it was being opened; not "
                             f"writing through it")
    finally:
        os.close(fd)
    return tmp, f


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
    """The stored config against this one, as parsed YAML data: never built into a Config, which would import
    a `module:Class` it names before the comparison could refuse it."""
    stored = checks.stored_config(path, attrs)
    differ = checks.config_differences(stored, cfg, ignore=config_mod.RUNTIME_KEYS)
    if differ:
        flat_s, flat_c = checks.flat(stored), checks.flat(cfg.to_dict())
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
    if moving and stored.get("rounds") != cfg.rounds:
        raise ConfigError(f"rounds = {cfg.rounds}: the checkpoint's run has {stored.get('rounds')}, and "
                          f"{', '.join(moving)} (cosine with rounds: null) takes its horizon from it, so the rates "
                          f"already used would change; keep rounds = {stored.get('rounds')}, or set the schedule's "
                          f"rounds explicitly")


@dataclass
class ResumePoint:
    round: int
    path: str
    wall_s: float = 0.0
    damaged: list = field(default_factory=list)     # [(path, reason)] newer checkpoints that were skipped
    partial: bool = False       # state this run declares may be missing (a fork: it starts as on a fresh run)


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
            checks.check_attrs(path, attrs)     # a BadCheckpoint (exit 2), not damaged: its checksum holds
            _check_round(attrs, round_)
        except DamagedCheckpoint as e:
            damaged.append((path, str(e)))
            say(f"checkpoint {path} is damaged ({e}); trying the previous one")
            continue
        _check_config(path, attrs, cfg)
        dim = _check_run_log(cfg, round_)
        check_contents(path, cfg, dim)
        if damaged:
            say(f"resuming from {path} (round {round_}) instead of the damaged newer checkpoint(s)")
        return ResumePoint(round_, path, float(attrs["wall_s"]), damaged)
    raise InputError(f"--resume: every checkpoint in {ckpt_dir(cfg.out)} is damaged "
                     f"({'; '.join(f'{os.path.basename(p)}: {r}' for p, r in damaged)}); nothing to continue")


def check_contents(path, cfg, dim=None):
    """Rank 0, before anything is built: the checks that need no model (`checkpoint_checks.check_stored`);
    `dim`, the model's length as run.h5 recorded it, where known."""
    with h5py.File(path, "r", locking=False) as f:
        checks.check_stored(path, f, finite=cfg.runtime.on_nonfinite != "continue", dim=dim)


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
    path = os.path.join(cfg.out, "run.h5")
    if not os.path.exists(path):
        raise InputError(f"--resume: {path} is missing; a run is continued together with its log")
    try:
        with open_run(path) as f:
            rows, run_hash, dim = f["metrics/round"].shape[0], f.attrs.get("config_hash"), f.attrs.get("dim")
    except (OSError, KeyError) as e:
        raise InputError(f"--resume: {path} cannot be read ({e})") from None
    if run_hash != cfg.hash():
        raise InputError(f"--resume: {path} was written for another config (hash {run_hash}, this config "
                         f"{cfg.hash()})")
    if rows < round_:
        raise InputError(f"--resume: {path} has {rows} rounds, fewer than checkpoint round {round_}")
    return int(dim) if isinstance(dim, numbers.Integral) and dim > 0 else None


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

    Collective, in two steps. First every rank checks what it will load against what this run declares
    (`checkpoint_checks`: rank 0 the global model, the server and optimizer state; each rank its own clients'
    states and the participation state) and all vote as at set-up: a refusal on any rank (exit 2 for a
    mismatch, naming the dataset, the expected and the found shape) ends every rank with Refused, its
    message printed once, before anything is loaded and before run.h5 is reopened. Then each rank loads.

    Each worker reads its own clients' states from the file itself (read-only, no HDF5 locking) instead
    of rank 0 reading everything and sending it on: no message per client, no single rank holding or
    reading all states, and reads spread over the workers, which suits parallel file systems; the
    placement is recomputed for this run's `-n`, so any `-n` can continue any checkpoint.
    """
    checked = error = None
    try:
        checked = _read_checked(exp, point)
    except Exception as e:  # noqa: BLE001 - every rank must reach the vote whatever went wrong
        error = e
    _vote(exp.comm, error)
    participation, server = checked
    if exp.comm.is_server:
        exp.load_state_dict({**server, "participation": participation})
    else:
        exp.participation.load_state(participation)
    with h5py.File(point.path, "r", locking=False) as f:
        clients = f.get("clients")
        for cid in sorted(exp.clients.mine):
            if clients is not None and str(cid) in clients:
                exp.load_client_state(cid, _read_group(clients[str(cid)]))
    return point.round


def _read_checked(exp, point):
    """(participation state, server-side state or None) read and checked, this rank's client states checked
    (their shapes and dtypes: they are read one at a time when loaded); BadCheckpoint on a mismatch."""
    path = point.path
    with h5py.File(path, "r", locking=False) as f:
        # Every rank plans rounds itself, so the participation state (e.g. the simulated clock) goes to all.
        participation = _read_group(f.get("participation"))
        checks.check_like(path, "participation", participation, exp.participation.state(), "participation state")
        server = _read_server_side(exp, point, f) if exp.comm.is_server else None
        specs = checks.client_expectations(exp)
        clients = f.get("clients")
        for cid in sorted(exp.clients.mine):
            if clients is not None and str(cid) in clients:
                checks.check_client(path, cid, clients[str(cid)], specs)
    return participation, server


def _read_server_side(exp, point, f):
    """Rank 0: the groups `Experiment.load_state_dict` takes, each declared entry checked; on a resume (not a
    fork, whose new algorithm may declare other state) a declared entry must be there."""
    path = point.path
    groups = {name: _read_group(g) for name, g in f.items() if isinstance(g, h5py.Group) and name != "clients"}
    groups["global"] = f["global"][()] if isinstance(f.get("global"), h5py.Dataset) else None
    for where, (shape, dtype, finite, what) in checks.server_expectations(exp).items():
        group, _, name = where.rpartition("/")
        value = groups.get(group, {}).get(name) if group else groups.get(where)
        if value is None:
            if point.partial and group:
                continue
            raise checks.BadCheckpoint(f"checkpoint {path}: /{where} ({what}) is missing; expected shape "
                                       f"{tuple(shape)} ({np.dtype(dtype)})")
        checks.check_entry(path, where, value, shape, dtype, finite, what)
    for stage in exp.stages:
        name = f"stage_{stage.name}"
        checks.check_like(path, name, groups.get(name, {}), stage.state(), f"upload stage {stage.name}'s state")
    return groups


def _vote(comm, error):
    """The set-up vote (`launch.set_up`) for loading: on any rank's error every rank raises Refused with the
    worst exit code, the lowest such rank having printed its message."""
    code = 0 if error is None else (error.exit_code if isinstance(error, FedmpiError) else EXIT_FAILED)
    worst, speaker = comm.agree(code)
    if worst == 0:
        return
    if comm.rank == speaker:
        for line in report_lines(error, comm.rank if comm.size > 1 else None):
            print(line, file=sys.stderr, flush=True)
    comm.close()
    raise Refused(worst)


def _read_group(group):
    return {} if group is None else {name: ds[()] for name, ds in group.items()}


def set_aside(point):
    """Renames the damaged checkpoints skipped by `choose` to *.damaged, so they are kept for inspection
    but never chosen or counted again (called once the resume really starts)."""
    for path, _ in point.damaged:
        if os.path.exists(path):
            os.replace(path, path + ".damaged")
