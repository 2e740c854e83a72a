"""fedmpi: an MPI-based simulator for federated learning research on HPC machines."""

__version__ = "0.1.0"
