"""The numerical core: seeded random streams, the flat parameter vector, local training (one client
or a batched group), learning-rate schedules, the model zoo, timing and errors. No MPI, no files, no config
file: everything above is built on these."""
