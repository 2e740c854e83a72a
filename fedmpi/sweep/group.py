"""One experiment on its group of ranks, through `fedmpi run`'s own code path.

The group's communicator is made from the ranks the dispatcher named (`MPI_Comm_create_group`: collective over
those ranks only, so the other groups go on undisturbed); a group of one rank runs as `fedmpi run` at -n 1 does,
on a LocalComm. Then, as `fedmpi run` (fedmpi.cli): rank 0 claims the run folder (one lock per run folder),
`--resume` picks the checkpoint, and fedmpi.run.launch.run_experiment runs set-up and the rounds, writes run.h5
and the checkpoints. The only differences are the data set (the sweep's copy, loaded once per node) and the
failure scope (fedmpi.mpi.group_comm). Every line the experiment prints on stderr starts with `[NAME] `.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from fedmpi.core import console
from fedmpi.core.errors import EXIT_FAILED, EXIT_USAGE, FedmpiError, report_lines
from fedmpi.io.fork import plan_fork
from fedmpi.io.outdir import claim
from fedmpi.io.resume import plan_resume
from fedmpi.io.store import open_run
from fedmpi.mpi.group_comm import GroupComm, GroupLocal
from fedmpi.run.launch import run_experiment
from fedmpi.sweep.state import OVERWRITE, RESUME

TAG_SPAN = 30000        # Create_group's tag: below MPI's least tag bound (32767)


def group_comm(mpi, world, ranks, tag, host):
    """This rank's communicator for the group of `world` ranks `ranks` (collective over them only)."""
    if len(ranks) == 1:
        return GroupLocal(host)
    sub = world.Create_group(world.Get_group().Incl(list(ranks)), tag % TAG_SPAN)
    return GroupComm(sub, host)


def run_on(comm, cfg, mode, dataset, name, attrs=None, fork_from=None):
    """Runs the experiment `cfg` on `comm` (every rank of the group), `attrs` added to its run.h5's attributes;
    a new start forks from `fork_from` (OLD_OUT@ROUND) where the sweep gives one, a continued one resumes its own.
    Returns (exit code, run.h5's status, the failure's message): the message and status on the group's rank 0,
    empty elsewhere."""
    began = time.monotonic()
    with _labelled(f"[{name}] "):
        code, message = _run(cfg, comm, mode, dataset, attrs, fork_from)
    status = ""
    if comm.rank == 0:
        status, error = _run_status(cfg)
        message = message or error
    return code, status, message, time.monotonic() - began


def _run(cfg, comm, mode, dataset, attrs=None, fork_from=None):
    held, message = None, ""
    try:
        held = claim(cfg, comm, overwrite=mode == OVERWRITE, resume=mode == RESUME)
        resume = plan_resume(cfg, comm) if mode == RESUME else None
        fork = plan_fork(cfg, comm, fork_from) if fork_from and mode != RESUME else None
        code = run_experiment(cfg, comm, overwrite=mode == OVERWRITE, resume=resume, fork=fork, dataset=dataset,
                              attrs=attrs)
    except SystemExit as e:
        # launch._fail ended the experiment after a failure (on a group: GroupComm.abort, the group alone).
        code = e.code if isinstance(e.code, int) else EXIT_FAILED
    except FedmpiError as e:
        # A refusal before the rounds (the folder in use, --resume's checks, the set-up vote), agreed on every
        # rank; rank 0 carries the message (set-up's speaker printed its own already: Refused has none).
        code, message = e.exit_code, str(e)
        if message and comm.rank == 0:
            for line in report_lines(e):
                console.say(line)
        if held is not None and code == EXIT_USAGE:
            held.undo_if_untouched()
    finally:
        if held is not None:
            held.release()
    if getattr(comm, "ended", None) is None:
        comm.close()            # collective (as every path that got here): a no-op where it was closed already
    return code, message


def _run_status(cfg):
    """(status, error) that the experiment's run.h5 recorded ('', '' where there is none)."""
    path = os.path.join(cfg.out, "run.h5")
    if not os.path.exists(path):
        return "", ""
    try:
        with open_run(path) as f:
            return str(f.attrs.get("status", "")), str(f.attrs.get("error", ""))
    except (OSError, KeyError):
        return "", ""


class _Labelled:
    """A text stream that starts every line written to it with `label`."""

    def __init__(self, stream, label):
        self._stream, self._label, self._fresh = stream, label, True

    def write(self, text):
        pieces = []
        for piece in str(text).splitlines(keepends=True):
            if self._fresh:
                pieces.append(self._label)
            pieces.append(piece)
            self._fresh = piece.endswith(("\n", "\r"))
        return self._stream.write("".join(pieces))

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _labelled(label):
    previous = sys.stderr
    if previous is None:
        yield
        return
    sys.stderr = _Labelled(previous, label)
    try:
        yield
    finally:
        sys.stderr = previous
