"""Secure aggregation (docs/how-to/secure-aggregation.md): the server sees only the modular sum
of the clients' masked integer uploads (Bonawitz et al. 2017; SecAgg+ of Bell et al. 2020)."""
