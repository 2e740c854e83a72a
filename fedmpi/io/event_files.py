"""TensorBoard event files written synchronously, in the calling thread, for the live tracker
(fedmpi.run.tracking.tb_tracker) and `fedmpi export --tensorboard` alike. TensorBoard's EventFileWriter
writes from a thread of its own, where a full disk is a traceback on stderr and the error reaches the caller
only at a later call; here a failed write is an OSError naming the event file at the write that failed."""

from __future__ import annotations

import itertools
import os
import socket
import time


def new_event_file(folder):
    """(path, file open for writing) of a new event file in `folder`, named as TensorBoard's EventFileWriter
    names them (time, host, pid, a number) so readers pick it up; never an existing file (a run resumed in
    the same process within the same second gets the next number)."""
    stamp = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    for k in itertools.count():
        path = os.path.join(folder, f"{stamp}.{k}")
        try:
            return path, open(path, "xb")       # noqa: SIM115 - the caller closes it
        except FileExistsError:
            continue


class EventFile:
    """One new event file in `folder`: `write(*events)` appends TensorBoard Event protos and flushes, an
    OSError naming the file; the first record is the file version, as EventFileWriter writes it."""

    def __init__(self, folder, before_write=None):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.path, self._file = new_event_file(folder)
        self._records = RecordWriter(self._file)
        self._before_write = before_write       # a test aid's hook (fedmpi.io.write_errors.inject)
        try:
            self.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        except BaseException:
            self.discard()
            raise

    def write(self, *events):
        try:
            if self._before_write is not None:
                self._before_write(self.path)
            for event in events:
                self._records.write(event.SerializeToString())
            self._file.flush()
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), self.path) from None

    def close(self):
        self._file.close()

    def discard(self):
        """Closes and removes the file (an export that failed half-way leaves no partial file)."""
        try:
            self._file.close()
        except OSError:
            pass
        try:
            os.remove(self.path)
        except OSError:
            pass
