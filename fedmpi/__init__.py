"""fedmpi: an MPI-based simulator for federated learning research on HPC machines."""

__version__ = "0.2.0"


def __getattr__(name):
    # `fedmpi.simulate` without importing torch for every `import fedmpi` (the report tools do not need it).
    if name == "simulate":
        from fedmpi.api import simulate

        return simulate
    raise AttributeError(f"module 'fedmpi' has no attribute {name!r}")
