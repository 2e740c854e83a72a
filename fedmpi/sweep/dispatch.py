"""The sweep's queue on MPI's own means: rank 0 dispatches, every other rank runs experiments.

Messages (small int64 buffers, never pickled objects) travel on the sweep's own duplicate of COMM_WORLD:
- a rank that is free says READY [READY, rank, flags]; the first rank of a group that ended one says DONE
  [DONE, rank, experiment, exit code, milliseconds, flags, text bytes], followed by its message (its run.h5's
  status, a space, its error) when it has one; a free rank that received SIGTERM or Ctrl-C says SIGNALLED;
- rank 0 answers a free rank RUN [RUN, experiment, mode, k, rank_1 .. rank_k] (the group it joins), or, once
  nothing is left to run or the sweep stops, END [END, exit code].
Rank 0 hands the next experiment (fedmpi.sweep.schedule) to the free ranks as they report, and waits asleep
between messages (a short poll with sleeps, as fedmpi.mpi.comm's waits), so it leaves its core to the ranks
that train.

Stopping: a SIGTERM/SIGUSR1 on every rank (what mpiexec and SLURM send) stops each running experiment at its
next round boundary with a checkpoint (their own stop vote, fedmpi.mpi.signals); rank 0 starts nothing more,
waits for the running ones and ends every rank with 75. Ctrl-C does the same with 130, but waits at most
INTERRUPT_GRACE_S for the running experiments before it ends the launch (MPI_Abort), the index saying
`interrupted` for them. An experiment that ends with 75 or 130 stops the sweep the same way.
"""

from __future__ import annotations

import time

import numpy as np

from fedmpi.core import console
from fedmpi.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PREEMPTED
from fedmpi.mpi import signals

MSG_TAG, TEXT_TAG, WORK_TAG = 11, 12, 13
READY, DONE, SIGNALLED = 1, 2, 3
RUN, END = 1, 2
STOP_FLAG, INTERRUPT_FLAG = 1, 2
HEADER = 7
TEXT_BYTES = 4096
SLEEP_MIN_S, SLEEP_MAX_S = 1e-3, 0.05
INTERRUPT_GRACE_S = 10.0


def say(text):
    console.say(f"fedmpi sweep: {text}")


def _poll(request, on_wait=None):
    """Waits for `request` asleep; `on_wait()` runs between polls (it may raise)."""
    began = time.monotonic()
    while not request.Test():
        if on_wait is not None:
            on_wait()
        time.sleep(min(SLEEP_MAX_S, max(SLEEP_MIN_S, 0.05 * (time.monotonic() - began))))


class Dispatcher:
    """Rank 0's side (see the module docstring)."""

    def __init__(self, mpi, control, schedule, node_of):
        self.MPI, self.control, self.schedule, self.node_of = mpi, control, schedule, node_of
        self.free = set()
        self.stopping = None        # the exit code once the sweep stops
        self.deadline = None        # Ctrl-C: when rank 0 ends the launch itself

    def run(self) -> int:
        header = np.zeros(HEADER, dtype=np.int64)
        workers = self.control.Get_size() - 1
        while True:
            self._hand_out()
            if not self.schedule.running and len(self.free) == workers and (
                    self.stopping is not None or not self.schedule.queue):
                break
            request = self.control.Irecv([header, self.MPI.INT64_T], source=self.MPI.ANY_SOURCE, tag=MSG_TAG)
            try:
                _poll(request, self._watch)
            except KeyboardInterrupt:
                self._stop(EXIT_INTERRUPTED, "interrupted (SIGINT)")
                _poll(request, self._watch)
            self._receive(header)
        code = self.stopping if self.stopping is not None else self.schedule.exit_code()
        self.schedule.write()
        for rank in range(1, workers + 1):
            self.control.Send([np.array([END, code], dtype=np.int64), self.MPI.INT64_T], dest=rank, tag=WORK_TAG)
        return code

    def _hand_out(self):
        while self.stopping is None:
            picked = self.schedule.pick(self.free, self.node_of)
            if picked is None:
                return
            i, ranks = picked
            work = np.array([RUN, i, self.schedule.modes[i], len(ranks), *ranks], dtype=np.int64)
            for rank in ranks:
                self.control.Send([work, self.MPI.INT64_T], dest=rank, tag=WORK_TAG)
            self.free.difference_update(ranks)
            self.schedule.start(i, ranks)

    def _watch(self):
        if signals.requested() and self.stopping is None:
            self._stop(EXIT_PREEMPTED, f"stop requested ({signals.received()})")
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.schedule.interrupt_running("interrupted (SIGINT): the launch ended before it stopped")
            say(f"interrupted; experiments still running after {INTERRUPT_GRACE_S:.0f} s are marked interrupted "
                f"in the index")
            console.drain()
            self.MPI.COMM_WORLD.Abort(EXIT_INTERRUPTED)

    def _stop(self, code, why):
        if self.stopping is None or code == EXIT_INTERRUPTED and self.stopping != code:
            if self.stopping is None:
                ending = ("end now, marked interrupted" if code == EXIT_INTERRUPTED
                          else "finish their round and write a checkpoint")
                say(f"{why}: no new experiment starts; the {len(self.schedule.running)} running {ending}")
            self.stopping = code
            if code == EXIT_INTERRUPTED:
                self.deadline = time.monotonic() + INTERRUPT_GRACE_S

    def _receive(self, header):
        kind, rank = int(header[0]), int(header[1])
        flags = int(header[5])
        if kind == READY:
            self.free.add(rank)
        elif kind == DONE:
            text = ""
            if header[6] > 0:
                buf = bytearray(int(header[6]))
                self.control.Recv([buf, self.MPI.BYTE], source=rank, tag=TEXT_TAG)
                text = buf.decode(errors="replace")
            status, _, message = text.partition(" ")
            code = int(header[3])
            self.schedule.end(int(header[2]), code, status, message, header[4] / 1000.0)
            if code in (EXIT_PREEMPTED, EXIT_INTERRUPTED):
                self._stop(code, "an experiment stopped" if code == EXIT_PREEMPTED else "interrupted")
        if flags & INTERRUPT_FLAG:
            self._stop(EXIT_INTERRUPTED, f"interrupted (SIGINT on rank {rank})")
        elif flags & STOP_FLAG:
            self._stop(EXIT_PREEMPTED, f"stop requested (rank {rank})")


class Worker:
    """A rank's side: asks for work, runs it on its group (`run_one`), reports, until END."""

    def __init__(self, mpi, control, run_one):
        self.MPI, self.control, self.run_one = mpi, control, run_one
        self.rank = control.Get_rank()
        self.interrupted = False
        self.told = 0               # the flags rank 0 has been told already

    def _flags(self):
        return (STOP_FLAG if signals.requested() else 0) | (INTERRUPT_FLAG if self.interrupted else 0)

    def _send(self, kind, *values, text=b""):
        header = np.zeros(HEADER, dtype=np.int64)
        header[:2 + len(values)] = [kind, self.rank, *values]
        header[5] = self.told = self._flags()
        header[6] = len(text)
        self.control.Send([header, self.MPI.INT64_T], dest=0, tag=MSG_TAG)
        if text:        # right behind its header: same source, its own tag
            self.control.Send([text, self.MPI.BYTE], dest=0, tag=TEXT_TAG)

    def _watch(self):
        if self._flags() & ~self.told:
            self._send(SIGNALLED)

    def serve(self) -> int:
        self._send(READY)
        work = np.zeros(4 + self.control.Get_size(), dtype=np.int64)
        while True:
            request = self.control.Irecv([work, self.MPI.INT64_T], source=0, tag=WORK_TAG)
            while True:
                try:
                    _poll(request, self._watch)
                    break
                except KeyboardInterrupt:
                    self.interrupted = True
            if work[0] == END:
                return int(work[1])
            i, mode, k = int(work[1]), int(work[2]), int(work[3])
            ranks = [int(r) for r in work[4:4 + k]]
            try:
                code, status, message, wall_s = self.run_one(i, mode, ranks)
            except KeyboardInterrupt:
                self.interrupted = True
                code, status, message, wall_s = EXIT_INTERRUPTED, "interrupted", "interrupted (SIGINT)", 0.0
            except Exception as e:  # noqa: BLE001 - a fault of the sweep itself: end the launch, index kept
                console.say(f"fedmpi sweep: rank {self.rank} failed outside its experiment: {type(e).__name__}: {e}")
                console.drain()
                self.MPI.COMM_WORLD.Abort(EXIT_FAILED)
            if self.rank == ranks[0]:
                text = f"{status} {message}".encode()[:TEXT_BYTES] if (status or message) else b""
                self._send(DONE, i, code, int(round(wall_s * 1000)), text=text)
            self._send(READY)
