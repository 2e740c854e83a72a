"""Runnable examples of algorithms written outside fedmpi (docs/how-to/own-algorithm.md walks through them).

Each file is one algorithm; run it with the repository root on PYTHONPATH (on every rank):
`PYTHONPATH=$PWD mpiexec -n 3 fedmpi run CONFIG.yaml algorithm.name=examples.<file>:<Class>`.
"""
