"""Deployment realism: client availability and dropout, a simulated clock with stragglers,
deadlines and over-selection, and update compression with honest byte counts.

Every piece is a pure function of its inputs and of streams keyed by (seed, purpose, round, client), so
nothing here depends on `-n` or on where a client is hosted. docs/how-to/deployment.md specifies the keys, the
formulas and how the round loop uses them.
"""
