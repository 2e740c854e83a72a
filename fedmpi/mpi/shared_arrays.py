"""Node-shared arrays (`Comm.share_arrays`): the layout of several arrays in one shared-memory buffer, their
views, and the failure a node's ranks raise when another rank of the node could not make them.

`share_arrays` gives the ranks of one node one copy of a set of arrays (the data set) in an MPI-3
shared-memory window; every rank of the node fills its own share of the rows, so each is charged (first
touch) for about 1/ranks of it."""

from __future__ import annotations

import numpy as np

from fedmpi.core.errors import FedmpiError

# Arrays in a shared window start on page boundaries: a rank filling one array touches no page of another.
SHARED_ALIGN = 4096


def shared_layout(specs):
    """({name: (offset, shape, dtype)}, total bytes): `specs` {name: (shape, dtype)} packed into one buffer,
    each array on a SHARED_ALIGN boundary."""
    layout, offset = {}, 0
    for name, (shape, dtype) in specs.items():
        dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape)
        layout[name] = (offset, shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset += -(-nbytes // SHARED_ALIGN) * SHARED_ALIGN
    return layout, offset


def views(buffer, layout):
    return {name: np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset)
            for name, (offset, shape, dtype) in layout.items()}


def read_only(arrays):
    for a in arrays.values():
        a.flags.writeable = False
    return arrays


class PeerFailed(FedmpiError):
    """Raised on the ranks of a node whose shared data another rank of the node failed to produce; carries
    that rank's message, so that whichever rank reports the failure says why."""

    def __init__(self, code, local_rank, text):
        super().__init__(f"node-local rank {local_rank} could not make the node's shared data: {text}")
        self.exit_code = code
