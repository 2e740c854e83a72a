"""`--resume` and forks' loading: the newest valid checkpoint chosen and checked against this config and
run.h5 (`choose`, rank 0), the choice agreed on every rank (`plan_resume`), its contents checked against what
this run declares and then loaded on every rank (`load_into`, one vote first: nothing is loaded or reopened
when any rank refuses), and the checkpoints after it set aside. The files themselves: fedmpi.io.checkpoint;
what a dataset must hold: fedmpi.io.checkpoint_checks."""

from __future__ import annotations

import numbers
import os
import sys
from dataclasses import dataclass, field

import h5py
import numpy as np

from fedmpi import config as config_mod
from fedmpi.core import shared_base
from fedmpi.core.errors import EXIT_FAILED, ConfigError, FedmpiError, InputError, Refused, report_lines
from fedmpi.core.input_files import check_input
from fedmpi.io import checkpoint_checks as checks
from fedmpi.io.checkpoint import DamagedCheckpoint, ckpt_dir, ckpt_path, list_checkpoints, verify
from fedmpi.io.rank0 import decide
from fedmpi.io.store import open_run


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
    wire = (stored.get("runtime") or {}).get("wire_dtype", "float32")
    if wire != cfg.runtime.wire_dtype:
        raise ConfigError(f"--resume: runtime.wire_dtype = {cfg.runtime.wire_dtype}, but checkpoint {path} was written "
                          f"with {wire}; the wire's rounding changes the results, so it cannot change on resume "
                          f"(set runtime.wire_dtype={wire})")
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
        check_input(path, f"--resume: checkpoint {path}")   # a FIFO or a device is refused, not skipped
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
    check_input(path, f"--resume: {path}")
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


def _check_base(exp, point):
    """The frozen base (fedmpi.core.shared_base) must be the one the checkpoint's run trained on, as its run.h5
    beside the checkpoint folder recorded it: a checkpoint holds the adapters only."""
    digest = getattr(exp.flat.module, shared_base.MODULE_ATTR, "")
    run_file = os.path.join(os.path.dirname(os.path.dirname(point.path)), "run.h5")
    flag = "--fork-from" if point.partial else "--resume"
    shared_base.check_same_base(run_file, digest, flag, exp.cfg.model)


def _read_checked(exp, point):
    """(participation state, server-side state or None) read and checked, the client groups against the
    manifest (rank 0) and this rank's client states checked (shapes, dtypes, finite values, declared bounds;
    read again one at a time when loaded); BadCheckpoint on a mismatch."""
    path = point.path
    with h5py.File(path, "r", locking=False) as f:
        # Every rank plans rounds itself, so the participation state (e.g. the simulated clock) goes to all.
        participation = _read_group(f.get("participation"))
        checks.check_like(path, "participation", participation, exp.participation.state(), "participation state")
        server = _read_server_side(exp, point, f) if exp.comm.is_server else None
        if exp.comm.is_server:
            checks.check_client_ids(path, f, exp.cfg.partition.clients)
            _check_base(exp, point)
        specs, bounds = checks.client_expectations(exp), checks.client_bounds(exp)
        finite = exp.cfg.runtime.on_nonfinite != "continue"
        clients = f.get("clients")
        for cid in sorted(exp.clients.mine):
            if clients is not None and str(cid) in clients:
                # A fork's parent may hold state its new algorithm never loads: only what it declares is judged.
                checks.check_client(path, cid, clients[str(cid)], specs, bounds, finite, every_float=not point.partial)
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
    # The rest of the algorithm's server state against its fresh value (a NaN may be its "not yet").
    fresh = exp.state_dict().get("server", {})
    checks.check_like(path, "server", groups.get("server", {}), fresh, "algorithm state", finite=False)
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
