"""The data set once per node: `load_shared` gives every rank of a node the same read-only arrays in one
shared-memory window (`comm.share_arrays`), instead of one private copy per rank.

Sources that can write straight into the window (`sources.STREAMED`, e.g. synthetic) run on every rank
of the node, each writing only its share of every array's rows: a rank's memory then holds its share of
the data set (plus whatever of the rest it reads: the clients it trains, its test batches), and the
node holds the data set once. Every other source is loaded by the node's first rank alone, as before,
and copied into the window; that rank peaks at the data set twice over during the copy, the others wait.

At -n 1 (a LocalComm), with `runtime.shared_data: false`, or for a data set passed in by the in-process
API, the arrays are the plain private ones of `load_dataset`.
"""

from __future__ import annotations

from fedmpi.data import sources
from fedmpi.data.dataset import from_arrays, to_arrays
from fedmpi.data.load import check_loaded, load_dataset


def load_shared(cfg, comm):
    """The Dataset of `cfg`, its arrays shared by the ranks of this rank's node (collective over the node)."""
    if comm.size == 1 or not cfg.runtime.shared_data:
        return load_dataset(cfg)
    stream = None
    if cfg.data.classes is None and cfg.data.name in sources.STREAMED:
        stream = sources.STREAMED[cfg.data.name](cfg.data, cfg.seed, cfg.partition)
    if stream is not None:
        arrays = comm.share_arrays(_specs_or_error(stream.specs, comm), stream.fill)
    else:
        arrays = comm.share_arrays(*_loaded_by_first_rank(lambda: load_dataset(cfg), comm))
    dataset = from_arrays(cfg.data.name, arrays)
    if stream is not None:
        check_loaded(cfg.data, dataset)
    return dataset


def _specs_or_error(specs, comm):
    """The node's first rank's `specs()`, or its error (a missing or damaged file), which `share_arrays` raises
    on every rank of the node alike."""
    if not comm.node_leader:
        return None
    try:
        return specs()
    except Exception as e:  # noqa: BLE001 - the node's other ranks wait for the specs whatever went wrong
        return e


def _loaded_by_first_rank(load, comm):
    """(specs, fill) for `share_arrays` where the node's first rank loads the data set privately (`load()`) and
    copies it in; its failure (a missing file...) travels in place of the specs, so the whole node fails alike."""
    private = {}
    if comm.node_leader:
        try:
            private = to_arrays(load())
        except Exception as e:  # noqa: BLE001 - the node's other ranks wait for the specs whatever went wrong
            return e, None

    def copy(arrays, part, parts):
        if part == 0:                       # the others have nothing to copy
            for name, a in arrays.items():
                a[...] = private.pop(name)  # the private copy goes as soon as it is in the window

    return {name: (a.shape, a.dtype) for name, a in private.items()}, copy
