"""Where each round's time goes, per rank: seconds spent training, evaluating, in the broadcast, in the
reduction, waiting for other ranks, and in the server's update and logging (`/timing/<phase>` [round, rank]).

Every rank keeps a `Timer`; the communicator charges the time it sleeps while others have not arrived to
`wait` and the transfer itself to `bcast` or `reduce`, the round loop charges the rest. At each round's
reduction every rank contributes what it accumulated since its previous contribution (one row of
PHASES in the reduction's tail, zeros for the other ranks' rows), so the breakdown costs no message of its
own; rank 0 then adds what it spends after the reduction (the server update, the evaluation) to its own
row. What a rank spends after its contribution lands in the next round's row (for a worker: waiting for
the server's next broadcast), so each rank's rows add up to its wall time.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

PHASES = ("train", "eval", "bcast", "reduce", "wait", "server")


class Timer:
    def __init__(self):
        self.seconds = np.zeros(len(PHASES))

    def add(self, phase, seconds):
        self.seconds[PHASES.index(phase)] += seconds

    @contextlib.contextmanager
    def phase(self, name):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def take(self) -> np.ndarray:
        """The seconds per phase since the last take (and restart from zero)."""
        out, self.seconds = self.seconds, np.zeros(len(PHASES))
        return out
