"""Runs several configs one after another in ONE MPI job (torch is imported once per rank).

Usage: mpiexec -n N python run_many.py CONFIG.yaml [CONFIG.yaml ...]. Each config's `out` gets its own
run.h5 exactly as `fedmpi run CONFIG --overwrite` would write it.
"""

import sys

from fedmpi import config
from fedmpi.comm import make_comm
from fedmpi.launch import run_experiment

for path in sys.argv[1:]:
    code = run_experiment(config.load(path), make_comm(), overwrite=True)
    if code:
        sys.exit(code)
