"""Checkpoints `OUT/ckpt/ckpt-<round>.h5` and `--resume` (docs/explanation/design.md §3, contract); the only module
that writes checkpoint HDF5.

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
  /manifest/clients, /manifest/entries  the ids of the clients stored under /clients (increasing) and how
                   many entries each has: a resume finds a client group that is missing, added or changed
                   against them (fedmpi.io.checkpoint_checks.check_client_ids)
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
import os
import re
import secrets
from datetime import datetime, timezone

import h5py
import numpy as np

import fedmpi
from fedmpi.core.errors import InputError
from fedmpi.io import write_errors
from fedmpi.io.disk_room import Room

# 2: with /manifest; a format-1 checkpoint is refused by name (`_check_version`), not as damaged
FORMAT = 2
MANIFEST = "manifest"      # /manifest: which clients have a /clients group, and how many entries each
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
    """Builds one checkpoint in a temporary file next to its final name; `commit` moves it into place.

    Every step reserves its room on disk first (disk_room.Room: a full disk refuses the write before HDF5
    sees it) and any failure is WriteFailed naming the checkpoint with the system's reason (exit 1); the
    temporary file is removed (fedmpi.io.write_errors: where HDF5 itself failed its handle is left open)."""

    def __init__(self, cfg, round_, wall_s, world_size):
        self.cfg, self.round = cfg, round_
        self.path = ckpt_path(cfg.out, round_)
        self.tmp = self.f = self.room = None
        with write_errors.writing(self.path) as writing:
            os.makedirs(ckpt_dir(cfg.out), exist_ok=True)
            for stale in glob.glob(os.path.join(ckpt_dir(cfg.out), ".ckpt-*.tmp")):
                os.remove(stale)    # left by a job killed while writing; only one job writes to an out
            self.tmp, self.f = _create_temporary(ckpt_dir(cfg.out), round_)
            writing.discard, writing.handle = self.tmp, self.f
            self.room = Room(self.tmp, self.path)
            self.digests = {}
            self.client_entries = {}    # cid -> how many entries its /clients group has (the manifest)
            attrs = {"round": int(round_), "fedmpi_version": fedmpi.__version__, "format": FORMAT,
                     "config": cfg.to_yaml(), "config_hash": cfg.hash(), "seed": int(cfg.seed), "rng": RNG_NOTE,
                     "wall_s": float(wall_s), "world_size": int(world_size),
                     "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            self.room.ensure(len(attrs["config"]))
            self.f.attrs.update(attrs)

    def _end(self):
        """Where the file ends now, counting what HDF5 allocated but holds in its cache."""
        return max(self.f.id.get_filesize(), os.path.getsize(self.tmp))

    def _put(self, path, value):
        a = np.asarray(value, order="C")
        if a.dtype.kind not in "biuf":
            raise TypeError(f"checkpoint entry {path}: dtype {a.dtype} is not numeric")
        with write_errors.writing(self.path, self.tmp) as writing:
            writing.handle = self.f
            self.room.ensure(self._end() + a.nbytes)
            write_errors.inject("checkpoint", self.path)
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
        if state:
            self.client_entries[int(cid)] = len(state)

    def commit(self, keep):
        """Manifest, checksum, close, fsync, rename into place, fsync the folder, prune to the newest `keep`."""
        ids = sorted(self.client_entries)
        self._put(f"{MANIFEST}/clients", np.array(ids, dtype=np.int64))
        self._put(f"{MANIFEST}/entries", np.array([self.client_entries[c] for c in ids], dtype=np.int64))
        with write_errors.writing(self.path, self.tmp) as writing:
            writing.handle = self.f
            self.room.ensure(self._end())       # the metadata HDF5 writes when it closes the file
            write_errors.inject("commit", self.path)
            self.f.attrs["checksum"] = _combine(self.digests, dict(self.f.attrs))
            self.f.close()
            self.room.release()
            _fsync_path(self.tmp)
            os.replace(self.tmp, self.path)
            _fsync_path(ckpt_dir(self.cfg.out))
        for _, old in list_checkpoints(self.cfg.out)[keep:]:
            os.remove(old)
        return self.path

    def discard(self):
        """After a failure: the temporary file removed (closed first unless HDF5 failed writing it)."""
        if self.f is not None and write_errors.broken() is None:
            try:
                self.f.close()
            except Exception:  # noqa: BLE001 - it is being removed; nothing more to do for it
                pass
        if self.tmp and os.path.exists(self.tmp):
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
