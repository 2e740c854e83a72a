"""Round-by-round pairing: a baseline job and a fedmpi job run side by side and take turns, one round
each (A B A B ... at the scale of a round, not of a whole run).

Why: on a shared host the machine's speed drifts over tens of seconds (the same reference loop measured
0.89-1.65 s a round in runs a minute apart), so two runs made one after the other can still see different
machines. Taking turns a round at a time puts a round of each job within about a second of the other; the
per-round ratio of two such neighbours is what `bench.py` reports.

How: the driver (`Turns`) owns two named pipes per job, `<prefix>.go` and `<prefix>.done`, and passes the
prefix in $FEDMPI_BENCH_PACE. Before each round every process of the job (each MPI rank, or the reference
loop) reads one byte from `go`; after it, the job's timekeeper (rank 0) writes one byte to `done`. The driver
writes one byte per process to A's `go`, waits for A's `done`, then does the same for B, round after round.
A job that is not on its turn sleeps in a blocking read: no CPU, no polling. Each job's own per-round clock
starts after its wait, so neither job's figures include the other's rounds.

Nothing here is fedmpi: the pacing lives in the benchmark (bench/_rank.py wraps `run_round`, the reference
loop takes a `pace` object), and without $FEDMPI_BENCH_PACE nothing waits.
"""

from __future__ import annotations

import os
import select
import time

ENV = "FEDMPI_BENCH_PACE"
# The k-th of a job's independent processes ("ref x2") reads its own `go` pipe, `<prefix>.go<k>`: from one
# shared pipe, the first to finish a round could read the byte meant for the other, not yet at its first
# wait, and run ahead. (A job's MPI ranks share one pipe safely: no rank finishes a round the others have
# not started.)
PART_ENV = "FEDMPI_BENCH_PACE_PART"


def part_env(env, k):
    """A paced job's environment `env` (Turns.env) for the k-th of its independent processes (reporters > 1)."""
    return {**env, PART_ENV: str(k)}


class Baton:
    """A job's side: `wait()` before a round (blocks until the driver says go), `done()` after it (the job's
    timekeeper only). `waited` is the seconds spent waiting for turns, which the job's whole-process time
    leaves out."""

    def __init__(self, prefix, part=None):
        self.prefix = str(prefix)
        self.go_path = self.prefix + (".go" if part is None else f".go{part}")
        self._go = self._done = None
        self.waited = 0.0

    @classmethod
    def from_env(cls):
        prefix, part = os.environ.get(ENV), os.environ.get(PART_ENV)
        return cls(prefix, int(part) if part else None) if prefix else None

    def wait(self):
        began = time.monotonic()
        if self._go is None:
            self._go = os.open(self.go_path, os.O_RDONLY)
        if not os.read(self._go, 1):
            raise RuntimeError(f"{ENV}: the benchmark's driver closed {self.go_path}")
        self.waited += time.monotonic() - began

    def done(self):
        if self._done is None:
            self._done = os.open(self.prefix + ".done", os.O_WRONLY)
        os.write(self._done, b"d")


class JobEnded(Exception):
    """The job's process ended before it finished its turn (its last round was the previous turn, or it
    failed: the caller reads its exit code)."""


class Turns:
    """The driver's side for one job: `prefix` (a path in a folder of the driver's; the pipes are made here),
    `processes` (how many of the job's processes read `go`: its MPI ranks, 1 for the reference), `reporters`
    (how many write `done` after each round: 1, or each of the independent processes of "ref x2", which then
    read a `go` pipe each: `part_env(env, k)`)."""

    def __init__(self, prefix, processes, reporters=1):
        self.prefix, self.processes, self.reporters = str(prefix), int(processes), int(reporters)
        go_ends = [".go"] if self.reporters == 1 else [f".go{k}" for k in range(self.reporters)]
        self._ends = [*go_ends, ".done"]
        for end in self._ends:
            path = self.prefix + end
            if os.path.exists(path):
                os.unlink(path)
            os.mkfifo(path)
        # Read-write opens of a FIFO do not block, and keep both pipes open whichever side opens first.
        self._gos = [os.open(self.prefix + end, os.O_RDWR) for end in go_ends]
        self._done = os.open(self.prefix + ".done", os.O_RDWR)

    @property
    def env(self):
        return {ENV: self.prefix}

    def turn(self, proc, timeout):
        """Lets the job run one round and waits until it has; JobEnded where `proc` (its Popen) ends first,
        TimeoutError after `timeout` seconds."""
        if len(self._gos) == 1:
            os.write(self._gos[0], b"g" * self.processes)
        else:
            for go in self._gos:
                os.write(go, b"g")
        deadline = time.monotonic() + timeout
        pending = self.reporters
        while True:
            ready, _, _ = select.select([self._done], [], [], 0.5)
            if ready:
                pending -= len(os.read(self._done, pending))
                if not pending:
                    return
                continue
            if proc.poll() is not None:
                raise JobEnded(self.prefix)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.prefix}: no round finished in {timeout:.0f} s")

    def close(self):
        for fd in (*self._gos, self._done):
            os.close(fd)
        for end in self._ends:
            try:
                os.unlink(self.prefix + end)
            except FileNotFoundError:
                pass


def take_turns(jobs, rounds, timeout):
    """Runs `rounds` rounds of every job in `jobs` [(Turns, Popen)], in turn: round t of the first, round t
    of the second, ..., then round t + 1. A job's last round waits until the jobs before it have exited:
    their shutdown (the last log writes, freeing memory, MPI_Finalize: ~1 s of CPU for the quickstart) would
    otherwise run beside it and lengthen it (the quickstart's last round at -n 3 measured 2.5 s after the
    -n 1 job's last, against ~1.1 s for the others). A job that ends early (a failure) stops the
    alternation; the caller reads the exit codes."""
    for t in range(rounds):
        for k, (turns, proc) in enumerate(jobs):
            if t == rounds - 1:
                for _, earlier in jobs[:k]:
                    await_exit(earlier, timeout)
            try:
                turns.turn(proc, timeout)
            except JobEnded:
                return False
    return True


def await_exit(proc, timeout):
    """Waits until `proc` (a Popen, or anything with its `poll`) has ended; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"a paced job did not exit within {timeout:.0f} s of its last round")
        time.sleep(0.05)
