"""Decisions that rank 0 takes alone and every rank obeys (is `out` free? which checkpoint to resume?).

Only rank 0 looks at the files, so two ranks can never judge them differently, and the verdict reaches
the other ranks as one small buffer broadcast (no pickled objects). On refusal every rank leaves with the
same exit status, and only rank 0 carries the message, so the job prints it once.
"""

from __future__ import annotations

import numpy as np

from fedmpi.core.errors import FedmpiError, Refused


def decide(comm, judge):
    """Collective: rank 0 calls `judge()`, which returns (result, number) or raises.

    Returns (result, number) on rank 0 and (None, number) elsewhere. If `judge` raised, the communicator
    is closed (so MPI can finalize) and rank 0 raises that error while the other ranks raise Refused with
    its exit status (1 for an error that is not a FedmpiError).
    """
    result, error = None, None
    verdict = np.zeros(2, dtype=np.float64)          # [exit status (0 = go), number]
    if comm.is_server:
        try:
            result, number = judge()
            verdict[1] = number
        except Exception as e:  # noqa: BLE001 - the other ranks wait for a verdict whatever went wrong
            error = e
            verdict[0] = e.exit_code if isinstance(e, FedmpiError) else 1
    comm.bcast(verdict)
    if verdict[0]:
        comm.close()
        if error is not None:
            raise error
        raise Refused(int(verdict[0]))
    return result, float(verdict[1])
