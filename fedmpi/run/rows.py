"""Rank 0's rows on their way to the run log: taken off the round's critical path and written in batches.

A round's row waits until right after the next round's broadcast, while the workers train: there it is
sealed (the global model's fingerprint is taken; the model is unchanged until that round's server step)
and joins the batch. The batch goes to the log (`append_rows`: one resize and one write per HDF5 dataset,
whatever the number of rows) once its oldest row has waited `flush_s` seconds (`runtime.log_flush_s`; 0
writes every row at once), and always before a checkpoint, a stop, a failure and the end of the run
(`flush`): a checkpoint never gets ahead of the log, and rows after the newest checkpoint are the ones a
`--resume` recomputes anyway. Each HDF5 dataset costs ~0.4 ms a call however many rows it takes: ~10 ms
a row for a run's ~25 datasets, a third of a round of 100 tiny clients on the rank that also trains.

The trackers and the progress line hear of a row once it is in the log.
"""

from __future__ import annotations

import time

from fedmpi.core.fingerprint import fingerprint
from fedmpi.io.store import LogRow
from fedmpi.mpi import signals
from fedmpi.run.clip_warning import ATTR


class DeferredRows:
    def __init__(self, log, progress, num_clients, flush_s=1.0, tracking=None, metric_attrs=None, clip_warning=None):
        self.log, self.progress, self.tracking = log, progress, tracking
        self.clip_warning = clip_warning        # secure aggregation's (fedmpi.run.clip_warning), or None
        self.num_clients, self.flush_s, self.metric_attrs = num_clients, flush_s, metric_attrs
        self._waiting = None        # (round, record, seconds): the newest round's row, not sealed yet
        self._batch = []            # sealed rows: (round, LogRow, seconds)
        self._oldest = None         # when the batch's first row was sealed

    def add(self, t, record, seconds):
        """Round t's record (fedmpi.round.engine.RoundRecord), `seconds` its wall time; sealed by the next
        `seal` (after the next broadcast) or `flush`. Writes nothing: `add` comes before the next broadcast,
        which the workers wait for (a batch's write, ~12 ms for the quickstart's rows, used to fall due here
        about once a second)."""
        self._seal_waiting()        # (only where no broadcast sealed the previous row)
        self._waiting = (t, record, seconds)

    def seal(self):
        """The waiting row's fingerprint, while its model is unchanged; the batch goes to the log when due."""
        self._seal_waiting()
        if self._batch and time.monotonic() - self._oldest >= self.flush_s:
            self._write()

    def _seal_waiting(self):
        if self._waiting is not None:
            t, record, seconds = self._waiting
            self._waiting = None
            record.metrics["model_sha256"] = fingerprint(record.model)
            self._batch.append((t, LogRow(record.metrics, record.clients, record.timing), seconds))
            if self._oldest is None:
                self._oldest = time.monotonic()

    def flush(self):
        """Every row to the log now."""
        self.seal()
        self._write()

    def _write(self):
        batch, self._batch, self._oldest = self._batch, [], None
        if not batch:
            return
        with signals.deferred():
            self.log.append_rows([row for _, row, _ in batch], num_clients=self.num_clients)
            if self.clip_warning is not None:
                added = [self.clip_warning.see(t, row.metrics) for t, row, _ in batch]     # every row seen
                if any(added):
                    self.log.set_attrs(**{ATTR: self.clip_warning.text()})
        for t, row, seconds in batch:
            metrics = row.metrics
            if self.tracking:
                self.tracking.log_row(metrics.get("round", t), metrics, self.metric_attrs, row.clients, row.timing)
            if self.progress:
                self.progress.update(t, metrics, seconds)
