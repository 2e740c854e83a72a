"""`checkpoint.updates: true`: every counted client's update of every round, recorded on its host as the server
sums it, in OUT/updates/rank-<R>.h5 (R: the world rank that hosted the client; read them back, merged, with
fedmpi.uploads.recorded).

The recorder is the last upload stage (order 95, after the wire's rounding at 90), so what it writes is what
the algorithm's `accumulate` reads: the update's delta (vector - start, float32) and its weight. It returns
the update untouched, so a recorded run computes bit for bit what an unrecorded one does (the key is a
run-time key, out of the config hash).

Layout of one rank's file:
  /round_<t>                 t: the 0-based round
      start                  the round's start vector (the broadcast model), once per file and round
      client_<cid>           the client's delta, float32, attrs: weight (its weight in the average),
                             norm (the delta's Euclidean norm, in float64, for readers that need no more)
A round's group is made afresh when a process first writes to it, so a resumed run, which recomputes the
rounds after its checkpoint, replaces what the interrupted run left of them. The file is opened and closed
around each write: a killed run keeps every update written before it died, and a resume replaces a round
it had cut short.
"""

from __future__ import annotations

import os

import numpy as np

from fedmpi.algorithms.hooks import REDUCE
from fedmpi.uploads.base import UploadStage

ORDER_RECORD = 95       # after every stage of fedmpi's (the wire's rounding is 90): what reaches the sum
FOLDER = "updates"


def rank_file(out, rank) -> str:
    """The recording of world rank `rank` in the run folder `out`."""
    return os.path.join(out, FOLDER, f"rank-{int(rank)}.h5")


def world_rank() -> int:
    """This process's rank in the MPI job (0 outside one, and at -n 1)."""
    from fedmpi.mpi.launcher import world

    mpi = world()
    return 0 if mpi is None else mpi.COMM_WORLD.Get_rank()


def problems(checkpoint, *, protocol, secure_aggregation, algorithm_name) -> list:
    """Why checkpoint.updates cannot record this run (one line each; empty where it can or is off)."""
    if not checkpoint.updates:
        return []
    found = []
    if protocol != REDUCE:
        found.append(f"checkpoint.updates: records each client's update as the server sums it, which only "
                     f"algorithms uploading by reduce have; algorithm.name = {algorithm_name!r} uploads by "
                     f"{protocol!r} (set checkpoint.updates: false)")
    if secure_aggregation != "none":
        found.append(f"checkpoint.updates: under server.secure_aggregation = {secure_aggregation!r} the server "
                     f"never sees one client's update, so none can be recorded (set checkpoint.updates: false)")
    return found


class UpdateRecorder(UploadStage):
    """Writes each counted client's update into this rank's file (module docstring); changes nothing."""

    name, order = "record_updates", ORDER_RECORD
    reads = ("checkpoint", "out")

    @classmethod
    def build(cls, setting, *, checkpoint, out):
        """The recorder where checkpoint.updates is on and the algorithm uploads by reduce (fedmpi.run.resolve
        refuses the other algorithms); None otherwise."""
        if not checkpoint.updates or setting.algo.protocol != REDUCE:
            return None
        return cls(rank_file(out, world_rank()))

    def __init__(self, path):
        self.path = path
        self.fresh = set()      # the rounds whose group this process has made (older ones are replaced)

    def client(self, update, view):
        import h5py

        delta = update.delta().detach().to("cpu").float().numpy()
        name = f"round_{int(update.round)}"
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with h5py.File(self.path, "a", locking=False) as f:
            if update.round not in self.fresh:
                if name in f:
                    del f[name]
                group = f.create_group(name)
                group.create_dataset("start", data=update.start.detach().to("cpu").float().numpy())
                self.fresh.add(update.round)
            group = f[name]
            key = f"client_{int(update.cid)}"
            if key in group:
                del group[key]
            data = group.create_dataset(key, data=delta)
            data.attrs["weight"] = float(update.weight)
            data.attrs["norm"] = float(np.linalg.norm(delta.astype(np.float64)))
        return update
