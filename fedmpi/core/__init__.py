"""The numerical core: seeded random streams, the flat parameter vector, local training (one client
or a batched group), learning-rate schedules, the model zoo, timing, errors, and the primitives every writer
uses (output paths checked, files replaced without following links). No MPI, no run files, no config file:
everything above is built on these."""
