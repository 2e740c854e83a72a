"""The /metrics and /timing datasets of run.h5 (fedmpi.io.store): how each is created, what a row holds, and
the bytes of a new chunk (what `RunLog.append_rows` reserves room for)."""

from __future__ import annotations

import numpy as np

from fedmpi.core.timing import PHASES

METRIC_CHUNK = 256     # rows per chunk of /metrics datasets


def new_metric_chunk(value):
    """Bytes of the first chunk of a new /metrics dataset for `value` (see metric_dataset)."""
    if isinstance(value, (str, bytes)):
        return METRIC_CHUNK * 64
    return METRIC_CHUNK * 8 * (len(value) if np.ndim(value) == 1 else 1)


def metric_dataset(group, name, value, length, attrs):
    """A growable /metrics dataset shaped for `value`: text (S64), a [round, k] row, or one float per round."""
    if isinstance(value, (str, bytes)):
        ds = group.create_dataset(name, shape=(length,), maxshape=(None,), dtype="S64", chunks=(METRIC_CHUNK,),
                                  fillvalue=b"")
    elif np.ndim(value) == 1:
        k = len(value)
        ds = group.create_dataset(name, shape=(length, k), maxshape=(None, k), dtype="f8", chunks=(METRIC_CHUNK, k),
                                  fillvalue=np.nan)
    else:
        ds = growable(group, name, length)
    for key, v in attrs.items():
        ds.attrs[key] = v
    return ds


def append_timing(group, n, timings):
    """Rows n.. of /timing/<phase> [round, rank], one per [rank, phase] array of `timings` (NaN for a row
    without one, or where a resumed run has another number of ranks)."""
    while timings[-1] is None:      # as rows one by one: a row without timing adds nothing at the end
        timings = timings[:-1]
    ranks = next(t for t in timings if t is not None).shape[0]
    for i, phase in enumerate(PHASES):
        ds = group.get(phase)
        if ds is None:
            ds = group.create_dataset(phase, shape=(n, ranks), maxshape=(None, ranks), dtype="f8", fillvalue=np.nan,
                                      chunks=(METRIC_CHUNK, ranks))
        block = np.full((len(timings), ds.shape[1]), np.nan)
        for j, timing in enumerate(timings):
            if timing is not None and timing.shape[0] == ds.shape[1]:
                block[j] = timing[:, i]
        ds.resize((n + len(timings), ds.shape[1]))
        ds[n:] = block


def cell(ds, value):
    """What a row of `ds` holds for `value` (None: not measured this round)."""
    if ds.dtype.kind == "S":
        return (value or "").encode() if isinstance(value, str) else (value or b"")
    if value is None:
        return np.full(ds.shape[1:], np.nan) if ds.ndim > 1 else np.nan
    return value


def growable(group, name, length=0):
    return group.create_dataset(name, shape=(length,), maxshape=(None,), dtype="f8", chunks=(METRIC_CHUNK,),
                                fillvalue=np.nan)


def chunk_bytes(ds):
    return int(np.prod(ds.chunks)) * ds.dtype.itemsize if ds.chunks else 0
