"""Run under mpiexec: runs several experiments one after another in one job (one torch import per rank).

Usage: run_configs.py CONFIG.yaml [CONFIG.yaml ...]. Each config's run.h5 goes to its own `out`.
"""

import sys

from fedmpi import config
from fedmpi.comm import make_comm
from fedmpi.launch import run_experiment

for path in sys.argv[1:]:
    code = run_experiment(config.load(path), make_comm(), overwrite=True)
    if code:
        sys.exit(code)
