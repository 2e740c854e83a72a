"""The mpi4py call counter the MPI scripts share (count_collectives.py, large_count_check.py); they import it
from their own folder, which Python puts on sys.path for a script."""

import collections


class Recorder:
    """Counts the calls made on the wrapped mpi4py communicator."""

    def __init__(self, inner):
        self.inner, self.calls = inner, collections.Counter()

    def __getattr__(self, name):
        self.calls[name] += 1
        return getattr(self.inner, name)
