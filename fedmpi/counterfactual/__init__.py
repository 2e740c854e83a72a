"""Counterfactual runs: an experiment that differs from an original in one declared way and in nothing else
(docs/how-to/counterfactuals.md)."""
