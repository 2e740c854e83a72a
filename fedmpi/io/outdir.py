"""Exclusive ownership of a run's `out` folder: one job at a time writes run.h5 and ckpt/ there.

Rank 0 takes an exclusive `flock` on OUT/.fedmpi.lock (and writes its host and pid into it) before it
looks at anything in `out`, and holds it until the process ends; a second job on the same `out` finds
the lock taken and exits 2 naming the first job's host and pid, before it has loaded any data or
touched a file. The kernel drops the lock when the holding process ends in any way (kill -9 included),
so a stale lock file never blocks a later run. The lock file itself stays in `out` (harmless).

A process holds one lock per `out`: claiming an `out` it already holds (a script that runs and then
resumes the same config through `fedmpi.cli.main`) reuses that lock.

On a file system without flock support (some Lustre mounts) the lock is skipped with a warning: the
checks below still run, but two jobs started at the same moment are not told apart there.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from datetime import datetime, timezone

from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.io.rank0 import decide

LOCK_NAME = ".fedmpi.lock"
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
PATH_CHARS = 300


def _named(out):
    """`out` quoted for a message: a path is shown whole unless absurdly long."""
    return show(out, PATH_CHARS)


class Claim:
    """The held lock of one `out` (rank 0). `release` lets another job in; otherwise the lock lasts as long
    as this process."""

    def __init__(self, out, fd):
        self.out, self.fd = out, fd
        _HELD[_key(out)] = self

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            _HELD.pop(_key(self.out), None)


_HELD = {}      # real path of out -> this process's Claim on it


def _key(out):
    return os.path.realpath(out)


def claim(cfg, comm, overwrite=False, resume=False):
    """Collective: rank 0 takes `out` for this job and checks what is in it; every rank learns the verdict.

    Refusals (exit 2, nothing touched): --overwrite with --resume; `out` names a file or a place that
    cannot be created or written; another job holds `out`; `out` holds a run.h5 or checkpoints and
    neither --overwrite nor --resume was given. Returns the Claim on rank 0, None elsewhere.
    """
    held, _ = decide(comm, lambda: (claim_here(cfg.out, overwrite, resume), 0))
    return held


def claim_here(out, overwrite=False, resume=False):
    """What `claim` does on rank 0 (also usable without a communicator)."""
    if overwrite and resume:
        raise ConfigError("--resume and --overwrite exclude each other: continue the run in out, or replace it")
    if resume and not os.path.isdir(out):       # refused without creating the folder
        raise InputError(f"--resume: no checkpoint in {_named(out)}: that folder does not exist; nothing to "
                         f"continue (start a new run without --resume)")
    _make_folder(out)
    already = _key(out) in _HELD
    held = _lock(out)
    try:
        _check_contents(out, overwrite, resume)
    except BaseException:
        if not already:
            held.release()
        raise
    return held


def _make_folder(out):
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"out = {_named(out)} is a file, not a folder; choose another out=...")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"out = {_named(out)}: cannot create this folder ({e.strerror}); choose a writable "
                          f"place with out=...") from None


def _lock(out):
    held = _HELD.get(_key(out))
    if held is not None:            # flock would refuse a second open file of this same process
        return held
    path = os.path.join(out, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(f"out = {_named(out)} is not writable ({e.strerror}: {path}); choose a writable place "
                          f"with out=...") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise ConfigError(f"out = {_named(out)} is in use by another fedmpi job ({holder}); wait for it to end, "
                          f"or choose another out=...") from None
    except OSError as e:
        if e.errno not in NO_FLOCK:
            os.close(fd)
            raise ConfigError(f"out = {_named(out)}: cannot lock {path} ({e.strerror})") from None
        print(f"fedmpi: warning: the file system of {out} does not support flock ({e.strerror}); a second job "
              f"on the same out would not be detected", file=sys.stderr, flush=True)
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()} since {when}\n".encode(), 0)
    except OSError as e:
        os.close(fd)
        raise ConfigError(f"out = {_named(out)} is not writable ({e.strerror}: {path}); choose a writable place "
                          f"with out=...") from None
    return Claim(out, fd)


def _holder(fd):
    """'host H pid P since T' as the holding job wrote it (it may not have written it yet)."""
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "host and pid not written yet"


def _check_contents(out, overwrite, resume):
    from fedmpi.io.checkpoint import ckpt_dir, list_checkpoints

    path = os.path.join(out, "run.h5")
    if os.path.exists(path) and not (overwrite or resume):
        raise ConfigError(f"out = {_named(out)} already holds a run ({path}); continue it with --resume, "
                          f"replace it with --overwrite, or choose another out=...")
    if list_checkpoints(out) and not (overwrite or resume):
        # Stale checkpoints would otherwise be taken for this run's on a later --resume.
        raise ConfigError(f"out = {_named(out)} holds checkpoints ({ckpt_dir(out)}) but no run.h5; replace "
                          f"them with --overwrite, or choose another out=...")
