"""Runs an experiment to the end on every rank: set-up vote, the round loop, run log, checkpoints, and what
happens when a rank fails, is interrupted or the model diverges.

Set-up: every rank builds its Experiment, then all vote (`comm.agree`); if any rank failed (a bad config,
`Algorithm.check`, a missing file on one node) every rank ends with the worst exit code and one message,
before run.h5 exists and before --overwrite removes anything.

Failure contract (docs/explanation/design.md §5): an exception on any rank during the rounds ends the whole job at
once with one message naming the rank and the error, and `run.h5` says `failed` with that message. A worker sends its
error text to rank 0 (which records it and aborts the job); if rank 0 does not respond in time the worker
aborts alone. Ctrl-C (SIGINT on any rank) does the same with status `interrupted` and exit 130. Inside a sweep
(fedmpi.sweep) the communicator's `abort` ends the experiment's group of ranks only, and the SystemExit that
ends `_fail` is the experiment's exit code, which the sweep records (fedmpi.mpi.group_comm).

A rank that runs out of memory where Python or torch can tell (a MemoryError, torch's OutOfMemoryError) fails
like any other, with a message that says so, its peak memory and the node's (`fedmpi.run.memory`). A rank killed
outright (kill -9, the kernel's OOM killer: Linux usually kills instead of failing an allocation) cannot
report anything. mpiexec (MPICH hydra) then kills every other rank at once and prints "BAD TERMINATION OF
ONE OF YOUR APPLICATION PROCESSES ... EXIT CODE: 9" and "YOUR APPLICATION TERMINATED WITH THE EXIT STRING:
Killed (signal 9)" (the kernel's log, `dmesg`, names the OOM kill), so no watchdog runs here; under SLURM
launch with `srun --kill-on-bad-exit=1` for the same effect (SLURM reports an OOM kill in the job's state).
run.h5 keeps status `running` in that case, and the next --resume notes it in `resumes`.

Stop requests (fedmpi.mpi.signals) end the loop at a round boundary with a checkpoint; every rank returns 75.
A non-finite loss or model stops the run at that round with status `diverged` and exit 1
(`runtime.on_nonfinite: continue` logs it, records the first such round as run.h5's `nonfinite_round`
(1-based) and goes on); no checkpoint holding the non-finite model is written.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import sys
import time
import traceback

import fedmpi.round.engine as engine
from fedmpi.core import console, plugin_names
from fedmpi.core.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    ConfigError,
    Diverged,
    FedmpiError,
    Refused,
    StopRequested,
    report_lines,
)
from fedmpi.io import checkpoint, write_errors
from fedmpi.io.disk_room import WriteFailed
from fedmpi.io.outdir import replacing
from fedmpi.io.resume import load_into, set_aside
from fedmpi.io.store import RunLog, open_run
from fedmpi.mpi import signals
from fedmpi.mpi.base import WorkerFailed
from fedmpi.round.experiment import Experiment
from fedmpi.run.clip_warning import ClipWarning
from fedmpi.run.how import how_it_ran
from fedmpi.run.memory import is_out_of_memory, out_of_memory_text
from fedmpi.run.progress import AnnouncedEvaluation, Progress
from fedmpi.run.rows import DeferredRows
from fedmpi.run.setup import experiment
from fedmpi.run.tracking import Tracking

INTERRUPTED = "interrupted (SIGINT)"


def run_path(cfg):
    return os.path.join(cfg.out, "run.h5")


def _say(text):
    console.say(f"fedmpi: {text}")     # a broken pipe or closed stderr silences it; run.h5 has the truth


def set_up(cfg, comm, **parts) -> Experiment:
    """Builds the Experiment on every rank and agrees on the outcome (see the module docstring). Raises
    Refused (its message already printed once) on every rank if any rank failed."""
    exp = error = None
    try:
        exp = experiment(cfg, comm, **parts)
    except Exception as e:  # noqa: BLE001 - every rank must reach the vote whatever went wrong
        error = e
        culprit = None if isinstance(e, FedmpiError) or is_out_of_memory(e) else plugin_names.blamed(e)
        if culprit:     # a plug-in that cannot be built from this config: named by its key and class
            error = ConfigError(culprit)
        if os.environ.get("FEDMPI_DEBUG") and not isinstance(e, FedmpiError):
            traceback.print_exc()
    code = 0 if error is None else (error.exit_code if isinstance(error, FedmpiError) else EXIT_FAILED)
    worst, speaker = comm.agree(code)
    if worst == 0:
        return exp
    if comm.rank == speaker:
        lines = report_lines(error, comm.rank if comm.size > 1 else None)
        if is_out_of_memory(error):
            lines = [f"fedmpi: {out_of_memory_text(error, comm.rank if comm.size > 1 else None)}"]
        for line in lines:
            console.say(line)
    comm.close()
    raise Refused(worst)


def run_experiment(cfg, comm, overwrite=False, resume=None, fork=None, dataset=None, attrs=None) -> int:
    """Runs on every rank; `resume` is the fedmpi.io.resume.ResumePoint that `plan_resume` chose (--resume),
    `fork` the one `fork.plan_fork` chose (--fork-from: a new run from another run's checkpoint); `dataset`
    the config's data set loaded already (a sweep's, shared by its experiments: fedmpi.sweep.data); `attrs`
    more run.h5 attributes, written when the file is made or resumed (a sweep's set names)."""
    exp = set_up(cfg, comm, dataset=dataset)
    log = None
    tracking = Tracking()
    start = resume or fork
    try:
        first_round = load_into(exp, start) if start else 0
        how = how_it_ran(cfg, comm, exp)        # collective: rank 0 gets every rank's host, device, threads
        if comm.is_server:
            exp.how = {**how, **(attrs or {}), **cfg.counterfactual.run_attrs(fork.round if fork else None)}
            if fork:
                fork.tell_stages(exp.stages)    # privacy figures of the rounds that had the mechanism
            log = _open_log(cfg, comm, exp, overwrite, resume)
            log.metric_attrs = exp.metric_attrs
            if fork:
                fork.record(log)
            tracking = _open_tracking(cfg, log, resume, fork)
        _loop(cfg, comm, exp, log, start.wall_s if start else 0.0, first_round=first_round, tracking=tracking)
        if log:
            log.write_model(exp.global_model())
            log.finish("finished")
            tracking.close("finished")
        signals.ignore_all()
        comm.close()
        return 0
    except StopRequested as stop:
        # Every rank is here after the same round, with the checkpoint written (`_loop`): exit 75 everywhere.
        if log:
            log.write_model(exp.global_model())
            log.finish("preempted", str(stop))
            tracking.close("preempted")
            _say(str(stop))
        signals.ignore_all()
        comm.close()
        return stop.exit_code
    except Diverged as e:
        _fail(comm, log, str(e), str(e), e.exit_code, status="diverged", tracking=tracking)
    except KeyboardInterrupt:
        where = f" on rank {comm.rank}" if comm.size > 1 else ""
        _fail(comm, log, f"interrupted (SIGINT{where})", INTERRUPTED, EXIT_INTERRUPTED, status="interrupted",
              tracking=tracking)
    except WorkerFailed as e:
        first = e.text.splitlines()[0] if e.text else f"rank {e.rank} failed: unknown error"
        interrupted = first.startswith("interrupted")
        _fail(comm, log, first, e.text, EXIT_INTERRUPTED if interrupted else EXIT_FAILED,
              status="interrupted" if interrupted else "failed", tracking=tracking)
    except Refused:
        raise       # a collective refusal (load_into's vote): printed once, nothing written
    except Exception as e:  # noqa: BLE001 - every error must end the whole job, not just this rank
        code = e.exit_code if isinstance(e, FedmpiError) else EXIT_FAILED
        if isinstance(e, FedmpiError):     # says itself what failed (e.g. "cannot write OUT/run.h5: ...")
            message = str(e) if comm.is_server else f"rank {comm.rank} failed: {e}"
            detail = message
        else:
            culprit = plugin_names.blamed(e)
            message = (out_of_memory_text(e, comm.rank) if is_out_of_memory(e)
                       else f"rank {comm.rank} failed: {culprit or f'{type(e).__name__}: {e}'}")
            detail = message + "\n" + traceback.format_exc()
        _fail(comm, log, message, detail, code, tracking=tracking)


def _record_nonfinite(log, round_, what):
    """run.h5's `nonfinite_round` (1-based) and `nonfinite` (what was not finite), unless a resumed run's file
    already names an earlier round (`RunLog.reopen` drops one after the checkpoint it resumes from)."""
    if getattr(log, "path", None):
        log.close()
        with open_run(log.path) as f:
            if "nonfinite_round" in f.attrs:
                return
    log.set_attrs(nonfinite_round=round_, nonfinite=what)


def _fail(comm, log, message, detail, code, status="failed", tracking=None):
    signals.ignore_all()
    if comm.is_server or comm.size == 1:
        _say(message)
    if os.environ.get("FEDMPI_DEBUG") and detail != message:
        console.say(detail)
    if log and not write_errors.unusable(log.path):    # (else the message says run.h5 cannot be written)
        try:
            log.finish(status, message)
            log.set_attrs(error_detail=detail)
        except Exception as e:  # noqa: BLE001 - the job must still end
            _say(f"could not record the failure in {log.path}: {e}")
    if tracking:
        try:
            tracking.close(status)      # guarded: a tracker that fails to close is reported and dropped
        except WriteFailed:
            pass        # its disk failed too; the run's own error is the one line to print
    if write_errors.broken():       # HDF5's clean-up at exit would crash on the file it failed
        write_errors.end_process(code, comm.abort if comm.size > 1 else None)
    if comm.size > 1:
        if not comm.is_server:
            comm.report_failure(detail if status == "failed" else message)
        comm.abort(code)
    sys.exit(code)


def _create_log(cfg, comm, exp, overwrite):
    """The new run.h5; with --overwrite the old run is removed only once it exists (`outdir.replacing`)."""
    return replacing(cfg.out, overwrite, functools.partial(
        RunLog.create, run_path(cfg), cfg, comm.size, [socket.gethostname()], exp.partition_groups,
        extra_attrs={"algorithm": cfg.algorithm.name, "dim": exp.flat.dim, "device": str(exp.device),
                     "threads": exp.threads, "training_ranks": len(exp.workers), **exp.run_attrs(), **exp.how}))


def _open_log(cfg, comm, exp, overwrite, resume):
    if resume is None:
        return _create_log(cfg, comm, exp, overwrite)
    set_aside(resume)
    _say(f"resuming from {resume.path}: round {resume.round} of {cfg.rounds}, at -n {comm.size}")
    # Rows after the checkpoint are dropped: this run recomputes them.
    return RunLog.reopen(run_path(cfg), resume.round, config=cfg.to_yaml(), world_size=comm.size,
                         device=str(exp.device), threads=exp.threads, **exp.run_attrs(), **exp.how)


def _open_tracking(cfg, log, resume, fork=None):
    """The trackers of runtime.trackers (rank 0), continuing the resumed run's tracker runs (a fork's start
    with the rows copied from its parent); their identities go into run.h5's attributes for --resume."""
    if not cfg.runtime.trackers:
        return Tracking()
    previous = None
    if resume is not None:
        with open_run(log.path) as f:
            previous = {k: str(v) for k, v in f.attrs.items()}
    tracking = Tracking.open(cfg, previous)
    ids = tracking.identities()
    if ids and any((previous or {}).get(k) != v for k, v in ids.items()):
        log.set_attrs(**ids)
    if fork:
        tracking.replay(log.path, fork.round)
    return tracking


def _loop(cfg, comm, exp, log, wall_s=0.0, checkpoints=True, first_round=0, tracking=None):
    """Rounds `first_round`..cfg.rounds-1, in order (fedmpi.round.engine.run_round); on the server each round's row
    goes to `log` (a RunLog, or the in-memory recorder of `fedmpi.simulate`). A checkpoint is written at
    every due round boundary and, on a stop request, at the next one (`checkpoints=False`: never). The row
    then goes to `tracking` (fedmpi.run.tracking: the live trackers; None: none).

    `wall_s` (training seconds before this process started: a resumed run's checkpoint value) keeps the
    wall_s metric counting from the run's beginning across resumes.
    """
    progress = Progress(cfg.rounds, first_round, cfg.runtime.progress) if comm.is_server else None
    began = time.monotonic() - wall_s
    # Rank 0 seals a round's row right after the next round's broadcast, while the workers train, instead of
    # keeping them waiting for it, and writes rows in batches (fedmpi.run.rows); before a checkpoint, a stop
    # or the end every row is written at once.
    warning = ClipWarning(cfg.secagg.clip) if comm.is_server and cfg.server.secure_aggregation != "none" else None
    rows = DeferredRows(log, progress, exp.num_clients, cfg.runtime.log_flush_s, tracking, exp.metric_attrs,
                        warning)
    # Rank 0's progress hears of each evaluation of the global model (a long one gets a line before it).
    announced = AnnouncedEvaluation(exp.round_parts.evaluation, progress) if progress else None
    parts = dataclasses.replace(exp.round_parts, evaluation=announced) if announced else exp.round_parts
    stop_votes = 0      # server: ranks that asked to stop in the latest round; the next broadcast stops them all
    nonfinite_seen = False      # server: the first non-finite round (on_nonfinite: continue) is recorded
    try:
        for t in range(first_round, cfg.rounds):
            t0 = time.monotonic()
            if announced:
                announced.round_ = t
            outcome = engine.run_round(parts, t, stopping=stop_votes, after_broadcast=rows.seal)
            record = outcome.record
            if record is not None:
                wall_s = record.metrics["wall_s"] = time.monotonic() - began
                rows.add(t, record, time.monotonic() - t0)
                stop_votes = outcome.stop_votes
                if outcome.nonfinite and cfg.runtime.on_nonfinite == "continue" and log and not nonfinite_seen:
                    # The run goes on, but its figures from here are a non-finite model's: run.h5 says from
                    # which round (the analysis counts the run as diverged).
                    nonfinite_seen = True
                    rows.flush()
                    _record_nonfinite(log, t + 1, outcome.nonfinite)
                if outcome.nonfinite and cfg.runtime.on_nonfinite == "stop":
                    # Before any checkpoint of this round: the last checkpoint keeps a finite model. The
                    # workers, waiting for the next round, end with the job (as on a failure).
                    rows.flush()
                    raise Diverged(f"diverged in round {t + 1}: {outcome.nonfinite}; the newest checkpoint holds "
                                   f"the last finite model (runtime.on_nonfinite: continue would go on)")
            if checkpoints and checkpoint.due(cfg, t + 1):
                rows.flush()     # a checkpoint never gets ahead of the log (--resume checks the rows)
                checkpoint.save(exp, t + 1, wall_s)
        rows.flush()
    except StopRequested as stop:
        rows.flush()
        if checkpoints and not checkpoint.due(cfg, stop.round):     # else written at the end of the round
            checkpoint.save(exp, stop.round, wall_s)
        raise
    except Exception:
        try:        # a finished round's row is kept whatever ends the run (a full disk aside)
            rows.flush()
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass
        raise
    finally:
        if progress:
            progress.close()
