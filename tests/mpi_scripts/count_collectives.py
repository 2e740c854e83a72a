"""Run under mpiexec: counts the mpi4py calls each rank makes in FedAvg rounds.

Usage: count_collectives.py CONFIG OUT_JSON_PREFIX. Wraps the communicator's mpi4py object in a proxy that
records every method called on it during two rounds, and writes {method: count} per rank; where the round
joins several nodes through their leaders (fedmpi.mpi.hierarchy), the calls on the leaders' communicator
as "leaders.METHOD" too.
"""

import json
import sys

from call_counter import Recorder

from fedmpi import config
from fedmpi.mpi.comm import make_comm
from fedmpi.round.engine import run_round
from fedmpi.run.setup import experiment

cfg = config.load(sys.argv[1])
comm = make_comm()
exp = experiment(cfg, comm)
recorder = Recorder(comm.comm)
comm.comm = recorder
hierarchy = getattr(comm, "_round", None)
leaders = Recorder(hierarchy.leaders) if hierarchy is not None and hierarchy.between_nodes else None
if leaders is not None:
    hierarchy.leaders = leaders
for t in range(2):
    run_round(exp.round_parts, t)
comm.comm = recorder.inner
calls = dict(recorder.calls)
if leaders is not None:
    hierarchy.leaders = leaders.inner
    calls.update({f"leaders.{name}": count for name, count in leaders.calls.items()})
with open(f"{sys.argv[2]}-{comm.rank}.json", "w") as fh:
    json.dump(calls, fh)
comm.close()
