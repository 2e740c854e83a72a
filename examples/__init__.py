"""Runnable examples of algorithms written outside fedmpi (docs/extending.md walks through them).

Each file is one algorithm; run it from the repository root with
`fedmpi run CONFIG.yaml algorithm.name=examples.<file>:<Class>`.
"""
