"""Runs an Experiment to the end on every rank: run log, progress, and what happens when a rank fails.

Failure contract (DESIGN §5): an exception on any rank ends the whole job at once with one message naming
the rank and the error, and `run.h5` says `failed` with that message. A worker sends its error text to
rank 0 (which records it and aborts the job); if rank 0 does not respond in time the worker aborts alone.

A rank killed outright (kill -9, OOM killer) cannot report anything. mpiexec (MPICH hydra) then kills every
other rank at once (measured: well under a second, exit status 9), so no watchdog runs here; under SLURM
launch with `srun --kill-on-bad-exit=1` for the same effect. run.h5 keeps status `running` in that case,
and the next --resume notes "previous status running" in its `resumes` attribute.

Stop requests (fedmpi.signals) end the loop at a round boundary with a checkpoint; every rank returns 75.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
import traceback

import numpy as np

from fedmpi import checkpoint
from fedmpi.comm import WorkerFailed
from fedmpi.errors import EXIT_FAILED, EXIT_INTERRUPTED, FedmpiError, StopRequested
from fedmpi.experiment import Experiment
from fedmpi.progress import Progress
from fedmpi.store import RunLog


def run_path(cfg):
    return os.path.join(cfg.out, "run.h5")


def _say(comm, text):
    print(f"fedmpi: {text}", file=sys.stderr, flush=True)


def run_experiment(cfg, comm, overwrite=False, resume=None) -> int:
    """Runs on every rank; `resume` is the checkpoint.ResumePoint that `plan_resume` chose (--resume)."""
    log = exp = None
    try:
        exp = Experiment(cfg, comm)
        if resume:
            checkpoint.load_into(exp, resume)
        if comm.is_server:
            log = _open_log(cfg, comm, exp, overwrite, resume)
        _loop(cfg, comm, exp, log, resume.wall_s if resume else 0.0)
        if log:
            log.write_model(exp.x.cpu().numpy())
            log.finish("finished")
        comm.close()
        return 0
    except StopRequested as stop:
        # Every rank is here after the same round, with the checkpoint written (`_loop`): exit 75 everywhere.
        if log:
            log.write_model(exp.x.cpu().numpy())
            log.finish("preempted", str(stop))
            _say(comm, str(stop))
        comm.close()
        return stop.exit_code
    except KeyboardInterrupt:
        if log:
            log.finish("failed", "interrupted (SIGINT)")
        if comm.is_server:
            _say(comm, "interrupted")
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    except WorkerFailed as e:
        message = f"rank {e.rank} failed: {e.text.splitlines()[0] if e.text else 'unknown error'}"
        _fail(comm, log, message, e.text, EXIT_FAILED)
    except Exception as e:  # noqa: BLE001 - every error must end the whole job, not just this rank
        code = e.exit_code if isinstance(e, FedmpiError) else EXIT_FAILED
        message = f"rank {comm.rank} failed: {type(e).__name__}: {e}"
        if isinstance(e, FedmpiError):
            detail = message
        else:
            detail = message + "\n" + traceback.format_exc()
        _fail(comm, log, message, detail, code)


def _fail(comm, log, message, detail, code):
    _say(comm, message)
    if os.environ.get("FEDMPI_DEBUG") and detail != message:
        print(detail, file=sys.stderr, flush=True)
    if log:
        try:
            log.finish("failed", message)
            log.set_attrs(error_detail=detail)
        except Exception as e:  # noqa: BLE001 - the job must still end
            _say(comm, f"could not record the failure in {log.path}: {e}")
    if comm.size > 1:
        if not comm.is_server:
            comm.report_failure(detail)
        comm.abort(code)
    sys.exit(code)


def _create_log(cfg, comm, exp, overwrite):
    path = run_path(cfg)
    if overwrite:
        shutil.rmtree(os.path.join(cfg.out, "ckpt"), ignore_errors=True)
    groups = dict(exp.split.groups)     # /partition and /partition/server (DESIGN §3)
    return RunLog.create(path, cfg, comm.size, [socket.gethostname()], groups,
                         extra_attrs={"algorithm": cfg.algorithm.name, "dim": exp.flat.dim,
                                      "device": str(exp.device), "threads": exp.threads})


def _open_log(cfg, comm, exp, overwrite, resume):
    if resume is None:
        return _create_log(cfg, comm, exp, overwrite)
    checkpoint.set_aside(resume)
    _say(comm, f"resuming from {resume.path}: round {resume.round} of {cfg.rounds}, at -n {comm.size}")
    # Rows after the checkpoint are dropped: this run recomputes them.
    return RunLog.reopen(run_path(cfg), resume.round, config=cfg.to_yaml(), world_size=comm.size,
                         device=str(exp.device), threads=exp.threads)


def _loop(cfg, comm, exp, log, wall_s=0.0):
    """The rounds; a checkpoint at every due round boundary and, on a stop request, at the next one.

    `wall_s` (training seconds before this process started: a resumed run's checkpoint value) keeps the
    wall_s metric counting from the run's beginning across resumes.
    """
    progress = Progress(cfg.rounds, exp.start_round, cfg.runtime.progress) if comm.is_server else None
    began = time.monotonic() - wall_s
    try:
        for t in range(exp.start_round, cfg.rounds):
            t0 = time.monotonic()
            out = exp.run_round(t)
            if out is not None:
                metrics, clients = out
                wall_s = metrics["wall_s"] = time.monotonic() - began
                log.append(metrics, clients, num_clients=len(exp.parts))
                progress.update(t, metrics.get("test_acc", np.nan), metrics.get("test_loss", np.nan),
                                time.monotonic() - t0)
                exp.stopping = exp.stop_votes > 0     # the next broadcast tells every rank to stop
            if checkpoint.due(cfg, t + 1):
                checkpoint.save(exp, t + 1, wall_s)
    except StopRequested as stop:
        if not checkpoint.due(cfg, stop.round):     # else written just before, at the end of the round
            checkpoint.save(exp, stop.round, wall_s)
        raise
    finally:
        if progress:
            progress.close()
