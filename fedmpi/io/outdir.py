"""Exclusive ownership of a run's `out` folder: one job at a time writes run.h5 and ckpt/ there.

Rank 0 takes an exclusive `flock` on OUT/.fedmpi.lock (and writes its host and pid into it) before it
looks at anything in `out`, and holds it until the process ends; a second job on the same `out` finds
the lock taken and exits 2 naming the first job's host and pid, before it has loaded any data or
touched a file. The kernel drops the lock when the holding process ends in any way (kill -9 included),
so a stale lock file never blocks a later run. The lock file itself stays in `out` (harmless).

A process holds one lock per `out`: claiming an `out` it already holds (a script that runs and then
resumes the same config through `fedmpi.cli.main`) reuses that lock.

The lock file is opened without following a link (O_NOFOLLOW) and must be a plain file with no other hard
link: a link planted at OUT/.fedmpi.lock would otherwise make fedmpi truncate the file it points to.

`--overwrite` replaces the run in `out` without ever losing it to a run that cannot start (`replacing`):
OUT/run.h5 and OUT/ckpt are moved into a new folder OUT/.fedmpi-overwrite-XXXX, the new run.h5 is
created, and only then is the old run removed; if the new run.h5 could not be made the old run is moved
back. A folder of that name left behind (the job was killed in between) holds the old run whole.

On a file system without flock support (some Lustre mounts) the lock is skipped with a warning: the
checks below still run, but two jobs started at the same moment are not told apart there.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import shutil
import socket
import stat
import sys
import tempfile
from datetime import datetime, timezone

from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.output_paths import (
    FOLDER_ROOM,
    check_length,
    check_place,
    check_regular,
    check_store_uri,
    make_folders,
)
from fedmpi.io.checkpoint import ckpt_dir, list_checkpoints
from fedmpi.io.rank0 import decide

LOCK_NAME = ".fedmpi.lock"
ASIDE_PREFIX = ".fedmpi-overwrite-"
RUN_PARTS = ("run.h5", "ckpt", "updates")      # what --overwrite replaces
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
PATH_CHARS = 300


def _named(out):
    """`out` quoted for a message: a path is shown whole unless absurdly long."""
    return show(out, PATH_CHARS)


class Claim:
    """The held lock of one `out` (rank 0). `release` lets another job in; otherwise the lock lasts as long
    as this process."""

    def __init__(self, out, fd, made=(), lock_made=False):
        self.out, self.fd = out, fd
        self.made, self.lock_made = list(made), lock_made     # what claiming created (folders, top first)
        _HELD[_key(out)] = self

    def undo_if_untouched(self):
        """After a refusal (exit 2) before the run wrote anything: removes the lock file and the folders that
        claiming created, where nothing else was put in them, so that a refused run leaves no trace."""
        lock = os.path.join(self.out, LOCK_NAME)
        if self.lock_made and not any(os.path.lexists(os.path.join(self.out, name)) for name in RUN_PARTS):
            try:
                os.remove(lock)
            except OSError:
                return
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)        # only ever an empty folder
            except OSError:
                return

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
    def on_rank0():
        check_tracker_store(cfg)
        return claim_here(cfg.out, overwrite, resume), 0

    held, _ = decide(comm, on_rank0)
    return held


def check_tracker_store(cfg):
    """A tracker's store outside `out` (MLflow's file store at `runtime.tracking_uri`) obeys the place rule
    too (fedmpi.core.output_paths): never the current folder, a parent, $HOME or a repository's root."""
    if "mlflow" in cfg.runtime.trackers:
        try:
            check_store_uri(cfg.runtime.tracking_uri, "runtime.tracking_uri =")
        except InputError as e:
            raise ConfigError(str(e)) from None


def claim_here(out, overwrite=False, resume=False):
    """What `claim` does on rank 0 (also usable without a communicator)."""
    if overwrite and resume:
        raise ConfigError("--resume and --overwrite exclude each other: continue the run in out, or replace it")
    if resume and not os.path.isdir(out):       # refused without creating the folder
        raise InputError(f"--resume: no checkpoint in {_named(out)}: that folder does not exist; nothing to "
                         f"continue (start a new run without --resume)")
    made = _make_folder(out)
    already = _key(out) in _HELD
    lock_made = not os.path.lexists(os.path.join(out, LOCK_NAME))
    held = _lock(out)
    if not already:
        held.made, held.lock_made = made, lock_made
    try:
        _check_contents(out, overwrite, resume)
    except BaseException:
        if not already:
            held.undo_if_untouched()
            held.release()
        raise
    return held


def check_claim(out, overwrite=False, resume=False):
    """`claim_here`'s refusals, for `fedmpi run --dry-run`: the same checks, nothing made, locked or changed."""
    if overwrite and resume:
        raise ConfigError("--resume and --overwrite exclude each other: continue the run in out, or replace it")
    if resume and not os.path.isdir(out):
        raise InputError(f"--resume: no checkpoint in {_named(out)}: that folder does not exist; nothing to "
                         f"continue (start a new run without --resume)")
    check_run_folder(out)
    if os.path.isdir(out):
        _check_contents(out, overwrite, resume)


def check_run_folder(out):
    """ConfigError unless `out` may be a run's folder, with nothing made or opened: the place rule shared by
    every command (never '', the current folder or a parent, $HOME, a repository's root, a link, a name the
    file system cannot hold); a run only adds run.h5, ckpt/ and its lock to the folder, so other files may
    be there, but those names must be what a run writes (a regular run.h5 and lock file, a ckpt folder)."""
    try:
        if os.path.exists(out) and not os.path.isdir(out):
            check_regular(out, "out =")
            raise InputError(f"out = {_named(out)} is a file, not a folder; choose another out=...")
        check_place(out, "out =")
        check_length(out, "out =", room=FOLDER_ROOM)
        for name in ("run.h5", LOCK_NAME):
            check_regular(os.path.join(out, name), "out =")
        ckpt = ckpt_dir(out)
        if os.path.lexists(ckpt) and (os.path.islink(ckpt) or not os.path.isdir(ckpt)):
            raise InputError(f"out = {_named(out)}: {ckpt} is not a folder of checkpoints; fedmpi writes its "
                             f"checkpoints there (move it away, or choose another out=...)")
        for _, path in list_checkpoints(out) if os.path.isdir(ckpt) else ():
            check_regular(path, "out =")     # a later checkpoint of that round would be renamed over it
    except InputError as e:
        raise ConfigError(str(e)) from None


def _make_folder(out):
    check_run_folder(out)
    try:
        return make_folders(out)       # made folders are removed again where this fails part-way
    except OSError as e:
        raise ConfigError(f"out = {_named(out)}: cannot create this folder ({e.strerror}); choose a writable "
                          f"place with out=...") from None


def _lock(out):
    held = _HELD.get(_key(out))
    if held is not None:            # flock would refuse a second open file of this same process
        return held
    path = os.path.join(out, LOCK_NAME)
    fd = _open_lock_file(out, path)
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


def _open_lock_file(out, path):
    """The lock file opened for writing, refused (ConfigError) where it is a link, not a plain file, or a
    hard link of another file: the lock is truncated and rewritten, and must never reach another file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"out = {_named(out)}: {path} is a symbolic link; fedmpi never writes through "
                              f"one (remove it, or choose another out=...)") from None
        raise ConfigError(f"out = {_named(out)} is not writable ({e.strerror}: {path}); choose a writable place "
                          f"with out=...") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a plain file" if not stat.S_ISREG(st.st_mode) else f"a hard link ({st.st_nlink} names)"
        raise ConfigError(f"out = {_named(out)}: {path} is {what}; fedmpi writes its lock there and never "
                          f"into another file (remove it, or choose another out=...)")
    return fd


def _holder(fd):
    """'host H pid P since T' as the holding job wrote it (it may not have written it yet)."""
    try:
        text = os.pread(fd, 256, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "host and pid not written yet"


def _check_contents(out, overwrite, resume):
    path = os.path.join(out, "run.h5")
    if resume and os.path.islink(path):
        raise ConfigError(f"--resume: {path} is a symbolic link; fedmpi never writes through one (copy the run "
                          f"into out, or resume it where it lies)")
    for left in sorted(glob.glob(os.path.join(glob.escape(out), ASIDE_PREFIX + "*"))):
        print(f"fedmpi: note: {left} holds a run moved aside by an --overwrite that did not end (the job was "
              f"killed); move its files back into {out} to keep it, or delete it", file=sys.stderr, flush=True)
    if os.path.lexists(path) and not (overwrite or resume):
        raise ConfigError(f"out = {_named(out)} already holds a run ({path}); continue it with --resume, "
                          f"replace it with --overwrite, or choose another out=...")
    if list_checkpoints(out) and not (overwrite or resume):
        # Stale checkpoints would otherwise be taken for this run's on a later --resume.
        raise ConfigError(f"out = {_named(out)} holds checkpoints ({ckpt_dir(out)}) but no run.h5; replace "
                          f"them with --overwrite, or choose another out=...")


class Aside:
    """The old run of `out` moved into `folder` by --overwrite: `restore` puts it back, `discard` removes it."""

    def __init__(self, out, folder, moved):
        self.out, self.folder, self.moved = out, folder, moved

    def restore(self):
        """Moves the old run back; a part whose name is taken again stays in the aside folder (said once)."""
        for name in self.moved:
            target = os.path.join(self.out, name)
            if os.path.lexists(target):
                print(f"fedmpi: warning: {target} exists again; the old run's {name} stays in {self.folder}",
                      file=sys.stderr, flush=True)
                continue
            os.rename(os.path.join(self.folder, name), target)
        try:
            os.rmdir(self.folder)
        except OSError:
            pass

    def discard(self):
        shutil.rmtree(self.folder, ignore_errors=True)


def move_aside(out):
    """Renames OUT/run.h5 and OUT/ckpt (the link itself where one is a link) into a new uniquely named folder
    in `out`; an Aside. Nothing is deleted here."""
    moved = [name for name in RUN_PARTS if os.path.lexists(os.path.join(out, name))]
    folder = tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=out)
    for i, name in enumerate(moved):
        try:
            os.rename(os.path.join(out, name), os.path.join(folder, name))
        except OSError:
            Aside(out, folder, moved[:i]).restore()
            raise
    return Aside(out, folder, moved)


def replacing(out, overwrite, create):
    """`create()` (which writes the new OUT/run.h5), with the old run moved aside first when `overwrite`:
    removed once `create` returned, put back if it raised (see the module docstring). Returns what
    `create` returned."""
    if not overwrite:
        return create()
    aside = move_aside(out)
    try:
        made = create()
    except BaseException:
        aside.restore()
        raise
    aside.discard()
    return made
