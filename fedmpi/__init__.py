"""fedmpi: an MPI-based simulator for federated learning research on HPC machines.

The package is laid out in layers, each importing only those below it (docs/explanation/design.md; import-linter keeps
the rule in CI): cli > run | analysis > io > config > round > deploy | privacy > plans | uploads >
algorithms | data > mpi > core.
"""

import importlib

__version__ = "0.2.0"


def __getattr__(name):
    # `fedmpi.simulate` without importing torch for every `import fedmpi` (the report tools do not need it):
    # loaded by name on first use, so `import fedmpi` stays light and the root depends on no layer.
    if name == "simulate":
        return importlib.import_module("fedmpi.run.api").simulate
    raise AttributeError(f"module 'fedmpi' has no attribute {name!r}")
