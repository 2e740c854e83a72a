"""Run under mpiexec: counts the mpi4py calls each rank makes in FedAvg rounds.

Usage: count_collectives.py CONFIG OUT_JSON_PREFIX. Wraps the communicator's mpi4py object in a proxy that
records every method called on it during two rounds, and writes {method: count} per rank.
"""

import collections
import json
import sys

from fedmpi import config
from fedmpi.mpi.comm import make_comm
from fedmpi.round.engine import run_round
from fedmpi.round.experiment import Experiment


class Recorder:
    def __init__(self, inner):
        self.inner, self.calls = inner, collections.Counter()

    def __getattr__(self, name):
        self.calls[name] += 1
        return getattr(self.inner, name)


cfg = config.load(sys.argv[1])
comm = make_comm()
exp = Experiment(cfg, comm)
recorder = Recorder(comm.comm)
comm.comm = recorder
for t in range(2):
    run_round(exp.round_parts, t)
comm.comm = recorder.inner
with open(f"{sys.argv[2]}-{comm.rank}.json", "w") as fh:
    json.dump(dict(recorder.calls), fh)
comm.close()
