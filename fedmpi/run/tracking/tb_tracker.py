"""TensorBoard: event files under OUT/tensorboard/<run folder> (`tensorboard --logdir OUT/tensorboard`), written
with TensorBoard's own record writer and protocol buffers as `fedmpi export --tensorboard` does (torch's
SummaryWriter is not needed), flushed after every round so a running job can be watched. The config goes in as
hyperparameters (the HParams tab). Written synchronously, in this thread: TensorBoard's EventFileWriter writes
from a thread of its own, where a full disk is a traceback on stderr and the error reaches the run only at a
later call; here it is an OSError naming the event file at the write that failed (fedmpi.run.tracking).

Each fresh run gets a folder of its own (`run-<UTC start>`), so a run replaced with --overwrite stays
beside the new one instead of being mixed into it. --resume writes a new event file in the same folder that
starts with a SessionLog START at the resumed round: TensorBoard then drops the earlier file's points from
that round on (the resumed run recomputes them), so each round shows once."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

from fedmpi.io import series, write_errors
from fedmpi.io.event_files import EventFile
from fedmpi.run.tracking import Tracker

FOLDER = "tensorboard"


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, cfg, out, previous):
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self._event, self._summary = event_pb2, summary_pb2
        root = os.path.join(out, FOLDER)
        self.resumed = bool(previous) and os.path.isdir(os.path.join(root, previous))
        if previous and not self.resumed:
            self.note = f"{os.path.join(root, previous)} is gone; the resumed run writes to a new folder"
        self.identity = previous if self.resumed else _fresh_name(root)
        self.folder = os.path.join(root, self.identity)
        os.makedirs(self.folder, exist_ok=True)
        self.events = EventFile(self.folder, before_write=lambda path: write_errors.inject("tracker", path))
        self.where = self.events.path
        self._restart_marked = not self.resumed

    def _write(self, *events):
        """`events` appended and flushed; an OSError names the event file."""
        self.events.write(*events)

    def log_params(self, params):
        from tensorboard.plugins.hparams import summary_v2 as hparams  # its protocol buffer only, no TF

        if not self.resumed:        # the resumed folder holds them already
            self._write(self._event.Event(wall_time=time.time(), step=0, summary=hparams.hparams_pb(params)))

    def log_round(self, step, scalars, clients, wall_time):
        Event, Summary = self._event.Event, self._summary.Summary
        events = []
        if not self._restart_marked:
            # Points of the earlier file from this step on are orphans of the interrupted run.
            events.append(Event(wall_time=wall_time, step=step,
                                session_log=self._event.SessionLog(status=self._event.SessionLog.START)))
            self._restart_marked = True
        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars]
        for tag, row in clients.items():
            lo, hi, num, total, squares, limits, counts = series.histogram(row)
            values.append(Summary.Value(tag=tag, histo=self._summary.HistogramProto(
                min=lo, max=hi, num=num, sum=total, sum_squares=squares, bucket_limit=limits, bucket=counts)))
        if values:
            events.append(Event(wall_time=wall_time, step=step, summary=Summary(value=values)))
        self._write(*events)

    def close(self, status):
        self.events.close()

    def abandon(self):
        try:
            self.events.close()
        except OSError:
            pass        # what it could not write is lost with the tracker


def _fresh_name(root):
    stamp = datetime.now(timezone.utc).strftime("run-%Y%m%dT%H%M%S")
    name, k = stamp, 1
    while os.path.exists(os.path.join(root, name)):
        k += 1
        name = f"{stamp}-{k}"
    return name
