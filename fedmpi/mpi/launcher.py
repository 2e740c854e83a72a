"""The MPI job this process belongs to, as its launcher announced it before MPI started, and MPI's start.

A rank of several launched ranks must never end without MPI, once a Ctrl-C has reached it before MPI_Init:
MPICH's Hydra ends a job for a rank that exits (or calls MPI_Abort) only once that rank has joined the
job's PMI, so the ranks already inside their MPI_Init waited there for it forever, at full CPU, and the
mpiexec with them (a Ctrl-C 2.5 s into set-up did this). `world` therefore starts MPI where the run had not
yet, and `fedmpi.mpi.signals.start_mpi` holds a Ctrl-C back until MPI_Init has returned (a KeyboardInterrupt
raised inside mpi4py's import would leave MPI initialized with no module to abort it through).
"""

from __future__ import annotations

import os
import sys

# Where MPI launchers put a process's rank and the job's size before MPI starts: MPICH/hydra and Intel MPI,
# Open MPI, PMIx, srun (srun's per-step count: a batch script's own SLURM_NTASKS is no launch of this process).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def _announced(names):
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def launcher_rank():
    """This process's rank as its launcher announced it, or None outside a known launcher."""
    return _announced(RANK_VARIABLES)


def one_of_several() -> bool:
    """This process is one rank of a job its launcher started with more than one rank."""
    return (_announced(SIZE_VARIABLES) or 1) > 1


def world():
    """mpi4py's MPI, initialized, where this process is one rank of several; None otherwise (no launcher,
    -n 1, MPI finalized). MPI is started here if the run had not yet (see the module docstring): that waits
    until every rank has called MPI_Init, which each does in its run or on its own way out."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized():
        if not one_of_several():
            return None
        from mpi4py import MPI as mpi

        if not mpi.Is_initialized():        # (mpi4py.rc.initialize = False)
            mpi.Init()
    if mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() == 1:
        return None
    return mpi
