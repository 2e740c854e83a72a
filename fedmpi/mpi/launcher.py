"""The MPI job this process belongs to, as its launcher announced it before MPI started, and MPI's start."""

from __future__ import annotations

import os

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


def start_mpi():
    """mpi4py's MPI module, MPI initialized (its import calls MPI_Init)."""
    from fedmpi.mpi import signals

    signals.test_pause("mpi_init")
    from mpi4py import MPI
    signals.test_pause("claim")         # MPI is up; the claim of `out` comes next (fedmpi.cli)
    return MPI
