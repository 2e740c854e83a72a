"""Live experiment tracking (`runtime.trackers: [tensorboard, mlflow, wandb]`): rank 0 hands each round's row,
right after it is appended to run.h5, to the trackers named in the config. run.h5 stays the record.

What each tracker gets, under fedmpi.io.series' names (the same tags as `fedmpi export --tensorboard`):
- at the start, the config as hyperparameters (flattened dotted keys, `client.lr`, `server.clients_per_round`);
- per round (the round as the step), every number of the row: /metrics figures, a [round, k] figure's
  columns as NAME/LABEL, the phase times as timing/PHASE/rankR;
- per round, each per-client figure of the row: a histogram `clients/NAME` over the clients it measured
  (TensorBoard, W&B); MLflow has no histograms, so it gets `clients/NAME/min|q25|median|q75|max|mean`.

Failure is contained: a tracker that cannot start (package missing, server unreachable) or raises while
logging is reported once on rank 0's stderr, one line naming the tracker and why, and dropped; the run goes
on. A failing disk is not contained: a tracker's write that meets ENOSPC, EDQUOT, EIO, EFBIG or
EROFS (fedmpi.io.write_errors.DISK_ERRNOS) ends the run as a failed run.h5 write does, one line naming the
file, exit 1 (the disk the run writes to is full or failing: its next row or checkpoint would fail too).
The trackers are called after the row is in run.h5 and never see the model or any random stream, so
results (fingerprints) are the same with and without them. Packages are imported only when named.

A fork (--fork-from) starts new tracker runs and hands them the rows copied from its parent first.

Resume: each tracker's run identity (TensorBoard's folder, MLflow's run id, W&B's run id) is kept in run.h5's
attributes (`tracking_<name>`), and `--resume` continues that run; where it cannot (the MLflow store no
longer knows the id) a new run is started and the note says so.
"""

from __future__ import annotations

import importlib
import os
import time

from fedmpi.core import console
from fedmpi.io import series, write_errors
from fedmpi.io.disk_room import WriteFailed

# name -> (module, class) of each tracker, imported when a config names it.
TRACKERS = {
    "tensorboard": ("fedmpi.run.tracking.tb_tracker", "TensorBoardTracker"),
    "mlflow": ("fedmpi.run.tracking.mlflow_tracker", "MlflowTracker"),
    "wandb": ("fedmpi.run.tracking.wandb_tracker", "WandbTracker"),
}
ATTR_PREFIX = "tracking_"       # run.h5 attribute tracking_<name>: that tracker's run identity
REASON_CHARS = 200


def attr_name(tracker):
    return ATTR_PREFIX + tracker


def _reason(error):
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def _say(line):
    console.say(f"fedmpi: {line}")


class Tracking:
    """The trackers of one run on rank 0. Every call is guarded: a tracker that raises is dropped with one
    line on stderr (`say`), the others go on."""

    def __init__(self, trackers=(), say=_say):
        self.trackers = list(trackers)
        self.say = say
        self.dropped = {}        # name -> the one-line reason

    def __bool__(self):
        return bool(self.trackers)

    @classmethod
    def open(cls, cfg, previous=None, say=_say):
        """The trackers of `cfg.runtime.trackers`, started for the run in `cfg.out`; `previous` holds the
        run.h5 attributes of the run being resumed (its tracker identities), or None for a fresh run."""
        tracking = cls(say=say)
        out = os.path.abspath(cfg.out)
        params = {k: _param(v) for k, v in series.flat_params(cfg.to_dict()).items()}
        for name in cfg.runtime.trackers:
            module, class_name = TRACKERS[name]
            try:
                tracker_class = getattr(importlib.import_module(module), class_name)
                tracker = tracker_class(cfg, out, (previous or {}).get(attr_name(name)))
            except Exception as e:  # noqa: BLE001 - whatever stops a tracker, the run goes on without it
                if write_errors.is_disk_error(e):       # ... but a failing disk (see the module docstring)
                    raise WriteFailed(e.filename or os.path.join(out, name), e.strerror) from None
                tracking._drop(name, f"cannot start: {_reason(e)}")
                continue
            tracking.trackers.append(tracker)
            if tracker.note:
                say(f"tracker {name}: {tracker.note}")
            tracking._guard(tracker, "logging the config", tracker.log_params, params)
        return tracking

    def identities(self):
        """{run.h5 attribute: identity} of the trackers running, for --resume."""
        return {attr_name(t.name): t.identity for t in self.trackers if t.identity}

    def log_row(self, round_, metrics, metric_attrs=None, clients=None, timing=None):
        """One round's row, as appended to run.h5 (fedmpi.io.store.RunLog.append's arguments); `round_` is the
        row's /metrics/round (0 for the first round), logged as the 1-based step a person reads (the first
        round is step 1, as on the console and in `fedmpi report`)."""
        if not self.trackers:
            return
        step = int(round_) + 1
        scalars = series.row_scalars(metrics, metric_attrs, timing)
        per_client = series.row_clients(clients)
        wall = time.time()
        for tracker in list(self.trackers):
            self._guard(tracker, f"logging round {step}", tracker.log_round, step, scalars, per_client, wall)

    def replay(self, path, rows):
        """The first `rows` rows already in the run file at `path` (a fork's rows copied from its parent),
        so the trackers' curves start at round 0 as run.h5's do."""
        if not self.trackers or not rows:
            return
        try:
            attrs, stored = series.stored_rows(path, rows)
        except Exception as e:  # noqa: BLE001 - the curves start later; the run goes on
            self.say(f"trackers: the {rows} rows copied from the parent run were not replayed ({_reason(e)})")
            return
        for step, metrics, clients, timing in stored:
            self.log_row(step, metrics, attrs, clients, timing)

    def close(self, status):
        """Ends every tracker's run with the run's `status` (finished, preempted, failed, ...)."""
        for tracker in list(self.trackers):
            self._guard(tracker, "closing", tracker.close, status)
        self.trackers = []

    def _guard(self, tracker, what, fn, *args):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - a tracker's failure never reaches the run (a disk's does)
            self.trackers.remove(tracker)
            disk = write_errors.is_disk_error(e)
            if not disk:
                self._drop(tracker.name, f"{what} failed: {_reason(e)}")
            try:
                tracker.abandon()
            except Exception:  # noqa: BLE001 - it is dropped already; nothing more to do for it
                pass
            if disk:
                raise WriteFailed(e.filename or tracker.where or f"tracker {tracker.name}'s files",
                                  e.strerror or os.strerror(e.errno)) from None

    def _drop(self, name, reason):
        if name not in self.dropped:
            self.dropped[name] = reason
            self.say(f"tracker {name} dropped ({reason}); the run goes on, run.h5 has every figure")


def _param(value):
    """A hyperparameter as trackers take it: numbers, text and booleans as they are, the rest (lists,
    None) as their text."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


class Tracker:
    """What a tracker implements. `identity` (text) is its run's identity kept in run.h5 for --resume; `note`
    a line to print once started (e.g. that a resumed run could not be continued)."""

    name = ""
    identity = ""
    note = ""
    where = ""      # the file (or folder) it writes, named when its disk fails

    def log_params(self, params):
        """`params`: {dotted key: value} of the config."""

    def log_round(self, step, scalars, clients, wall_time):
        """`scalars`: [(tag, value)]; `clients`: {tag: finite values of the clients measured}."""
        raise NotImplementedError

    def close(self, status):
        """The run ended with fedmpi's `status` (finished, preempted, interrupted, failed, diverged)."""

    def abandon(self):
        """After a failure: release what can be released, quietly (close() may be what failed)."""
