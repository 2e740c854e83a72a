"""The MPI runtime: the communicators (`MpiComm` and its one-process twin `LocalComm`, both `Comm`), the
node-shared round buffers, the client-state wire format, signals (stop requests, Ctrl-C) and the per-rank
runtime (device, threads, client placement)."""
