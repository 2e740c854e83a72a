"""The wire form of a client's state (a dict of numeric arrays) and of a set of array specs: int64 meta rows
and the names' bytes, which any rank can send and rebuild without pickle (`MpiComm.gather_states` streams
checkpoint state this way; `MpiComm.share_arrays` describes the node's shared arrays with it)."""

from __future__ import annotations

import numpy as np

# One client's state travels as [array count], [count x STATE_META] int64 rows (dtype code,
# ndim, name length, shape padded to STATE_MAX_NDIM), the UTF-8 names as bytes, then each array's bytes.
STATE_MAX_NDIM = 8
STATE_META = 3 + STATE_MAX_NDIM
STATE_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "float16", "int64", "int32", "int16", "int8",
                                           "uint64", "uint32", "uint16", "uint8", "bool"))


def encode_state(state):
    """(meta rows, name bytes, contiguous arrays) of a dict[str, np.ndarray]; numbers and bytes only."""
    arrays = [np.asarray(value, order="C") for value in state.values()]
    meta, names = encode_specs({name: (a.shape, a.dtype) for name, a in zip(state, arrays)})
    return meta, names, arrays


def encode_specs(specs):
    """(meta rows, name bytes) describing {name: (shape, dtype)}, the form `decode_state_meta` reads."""
    names = []
    meta = np.zeros((len(specs), STATE_META), dtype=np.int64)
    for i, (name, (shape, dtype)) in enumerate(specs.items()):
        dtype, ndim = np.dtype(dtype), len(shape)
        if dtype not in STATE_DTYPES or ndim > STATE_MAX_NDIM or not name or "/" in name:
            raise TypeError(f"state entry {name!r} ({dtype}, {ndim}-d): a state is a dict of numeric arrays "
                            f"of at most {STATE_MAX_NDIM} dimensions under non-empty names without '/'")
        raw = name.encode()
        meta[i, :3] = STATE_DTYPES.index(dtype), ndim, len(raw)
        meta[i, 3:3 + ndim] = shape
        names.append(raw)
    return meta, np.frombuffer(b"".join(names), dtype=np.uint8)


def decode_state_meta(meta, name_bytes):
    """[(name, dtype, shape)] from the rows and name bytes made by `encode_state`."""
    out, pos, raw = [], 0, bytes(name_bytes)
    for code, ndim, length, *shape in meta.tolist():
        out.append((raw[pos:pos + length].decode(), STATE_DTYPES[code], tuple(shape[:ndim])))
        pos += length
    return out


def send_state(send, state: dict):
    """Sends one client's `state` as plain buffers through `send(array)`: its array count, then (if any) the
    metadata, the names and the arrays themselves, in that order (what `recv_state` reads)."""
    meta, names, arrays = encode_state(state)
    send(np.array([len(arrays)], dtype=np.int64))
    if arrays:
        send(meta)
        send(names)
        for a in arrays:
            send(a)


def recv_state(recv) -> dict:
    """One client's state from `recv(buffer)`, which fills and returns the buffer it is given."""
    count = recv(np.zeros(1, dtype=np.int64))[0]
    if count == 0:
        return {}
    meta = recv(np.zeros((count, STATE_META), dtype=np.int64))
    names = recv(np.zeros(int(meta[:, 2].sum()), dtype=np.uint8))
    return {name: recv(np.empty(shape, dtype=dtype)) for name, dtype, shape in decode_state_meta(meta, names)}
