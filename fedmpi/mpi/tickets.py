"""A job-wide ticket counter in node-shared memory: how a round's clients are dealt to the workers as they
become free (`runtime.client_dealing: auto`, fedmpi.round.clients).

A fixed deal, even one that balances the clients' sample counts (runtime.place_clients), leaves the round to
its slowest worker: on a shared host the same load takes one worker 10-60% longer than another in some
rounds, and the quickest then sleeps. Here each worker takes the next ticket when it is free, and ticket k
is the k-th client of the round's deal order, so a worker slowed down trains fewer clients.

The counter is one int64 on rank 0 in an MPI-3 shared-memory window of the node; a ticket is MPI's atomic
Fetch_and_op on it (~4 us; with a shared window MPI performs it in shared memory, so rank 0 need not make
progress: it may be training or asleep). Rank 0 sets the counter back to 0 before each round's broadcast;
every ticket of the previous round was taken before the workers arrived at that round's reduction, which
rank 0 has passed, and none of the new round's is taken before its broadcast.

Only where every rank is on one node: across nodes the atomic would need rank 0's progress.
"""

from __future__ import annotations

import numpy as np


class TicketCounter:
    def __init__(self, mpi, node):
        """Collective over `node`, which holds every rank of the job, rank 0 first."""
        self.MPI = mpi
        self.win = mpi.Win.Allocate_shared(8 if node.Get_rank() == 0 else 0, 8, comm=node)
        self.win.Lock_all(mpi.MODE_NOCHECK)
        self._one = np.ones(1, dtype=np.int64)
        self._zero = np.zeros(1, dtype=np.int64)
        self._got = np.zeros(1, dtype=np.int64)

    def take(self) -> int:
        """The next ticket: 0, 1, 2, ... since the last `reset`, each given to exactly one caller."""
        self.win.Fetch_and_op(self._one, self._got, 0, 0, self.MPI.SUM)
        self.win.Flush(0)
        return int(self._got[0])

    def reset(self):
        """Rank 0: the next ticket is 0 again (atomic with respect to `take`)."""
        self.win.Accumulate(self._zero, 0, op=self.MPI.REPLACE)
        self.win.Flush(0)

    def free(self):
        """Collective."""
        self.win.Unlock_all()
        self.win.Free()

