"""Shakespeare's arrays in binary beside LEAF's JSON: `DIR/binary/` holds one `.npy` file per array of
the data set's flat form (`dataset.to_arrays`: x/y train and test, the users' index arrays and offsets, the
class count) and `index.json`, which records each array's shape, dtype and CRC-32 and a fingerprint of the
JSON files the arrays were made from. `fedmpi data shakespeare` writes it; `data.name: shakespeare` reads it
instead of the JSON when the folder is there (a JSON-only folder, e.g. one LEAF wrote, reads as before).

Why `.npy` and not HDF5: an `.npy` file is its array's bytes after a short header, so `np.load(mmap_mode="r")`
maps it with no copy and no library beyond numpy, and a node's ranks then read the same page-cache pages;
h5py reads a dataset into memory (mapping one needs its file offset, outside h5py's public API, and holds
only for contiguous, unfiltered datasets). The index is JSON so that a person can read it.

Reading checks everything before any array is used, and refuses with InputError (exit 2) naming the file:
an index that is not this format, an array file missing, not an `.npy`, truncated or longer than its
header says, of another shape or dtype than the index records, whose bytes do not give the recorded CRC-32
(damage), or whose values do not make a data set (token ids or labels outside the vocabulary, user offsets
that do not cut the index arrays, ids outside the samples); and a binary whose JSON fingerprint differs from
the LEAF files beside it (the JSON was rebuilt or replaced, and the two would give different data sets).
Token ids are uint8 (80 characters), labels and index arrays int64: exactly the arrays the JSON reader makes.
"""

from __future__ import annotations

import glob
import json
import os
import zlib

import numpy as np

from fedmpi.core.errors import InputError
from fedmpi.core.input_files import MAX_JSON_DEPTH, check_input, open_input, parse_json, read_input
from fedmpi.mpi.topology import share_of

FOLDER = "binary"
INDEX = "index.json"
FORMAT = "fedmpi-leaf-npy"
VERSION = 1
SEQ, VOCAB = 80, 80         # fedmpi.data.leaf's SHAKESPEARE_SEQ and its vocabulary's size
# name -> dtype of every array, in the order they are written (`dataset.to_arrays`' names)
DTYPES = {"x_train": np.uint8, "y_train": np.int64, "x_test": np.uint8, "y_test": np.int64,
          "users_index": np.int64, "users_offsets": np.int64, "test_users_index": np.int64,
          "test_users_offsets": np.int64, "num_classes": np.int64}
FINGERPRINT_BYTES = 1 << 20     # the JSON files' first and last MiB, with their sizes, identify them
CRC_CHUNK = 1 << 24
REBUILD = ("rebuild it with `fedmpi data shakespeare --out DIR --overwrite`, or remove the binary/ folder to "
           "read the JSON files")


def files() -> tuple:
    """The binary form's files, relative to the data folder (the index last: what a reader opens first)."""
    return tuple(os.path.join(FOLDER, f"{name}.npy") for name in DTYPES) + (os.path.join(FOLDER, INDEX),)


def present(root) -> bool:
    """Whether `root` holds a binary form (its folder; a folder without a readable index is refused, not
    skipped)."""
    return bool(root) and os.path.isdir(os.path.join(root, FOLDER))


def json_fingerprint(root) -> dict:
    """{relative path: [bytes, CRC-32 of the first MiB, of the last MiB]} of the LEAF JSON files the reader
    would read (`train/*.json`, `test/*.json`)."""
    out = {}
    for part in ("train", "test"):
        for path in sorted(glob.glob(os.path.join(root, part, "*.json"))):
            with open_input(path, f"{path} (under data.root)") as fh:
                size = os.fstat(fh.fileno()).st_size
                head = fh.read(FINGERPRINT_BYTES)
                fh.seek(max(0, size - FINGERPRINT_BYTES))
                tail = fh.read(FINGERPRINT_BYTES)
            out[os.path.relpath(path, root)] = [size, zlib.crc32(head), zlib.crc32(tail)]
    return out


def _crc(array) -> int:
    flat = array.reshape(-1).view(np.uint8)
    crc = 0
    for start in range(0, len(flat), CRC_CHUNK):
        crc = zlib.crc32(flat[start:start + CRC_CHUNK], crc)
    return crc


def write(root, arrays, source=None):
    """Writes `arrays` (`dataset.to_arrays`' form) into `root/binary/` with its index; `source`: the folder whose
    JSON files they were made from (default `root`), fingerprinted into the index."""
    folder = os.path.join(root, FOLDER)
    os.makedirs(folder, exist_ok=True)
    entries = {}
    for name, dtype in DTYPES.items():
        a = np.ascontiguousarray(arrays[name], dtype=dtype)
        with open(os.path.join(folder, f"{name}.npy"), "wb") as fh:
            np.lib.format.write_array(fh, a, allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        entries[name] = {"shape": list(a.shape), "dtype": np.dtype(dtype).str, "crc32": _crc(a)}
    index = {"format": FORMAT, "version": VERSION, "arrays": entries,
             "json": json_fingerprint(source or root)}
    with open(os.path.join(folder, INDEX), "w", encoding="utf-8") as fh:
        json.dump(index, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def _index(root):
    path = os.path.join(root, FOLDER, INDEX)
    try:
        index = parse_json(read_input(path, f"{path} (under data.root)").decode("utf-8"), path, MAX_JSON_DEPTH)
        arrays = index["arrays"]
        ok = (index["format"] == FORMAT and index["version"] == VERSION and set(arrays) == set(DTYPES)
              and isinstance(index["json"], dict)
              and all(np.dtype(e["dtype"]) == DTYPES[n] and isinstance(e["crc32"], int)
                      and all(isinstance(d, int) and d >= 0 for d in e["shape"]) for n, e in arrays.items()))
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise InputError(f"{path}: not readable as the index of a binary Shakespeare build ({type(e).__name__}: "
                         f"{e}); {REBUILD}") from None
    if not ok:
        raise InputError(f"{path}: not the index of a binary Shakespeare build of this version ({FORMAT} "
                         f"{VERSION}, the arrays {', '.join(DTYPES)}); {REBUILD}")
    return path, index


def _header(root, name, entry):
    """(path, data offset, shape, dtype) of the array file `name`, checked against its index entry: an `.npy`
    header of the recorded shape and dtype, and a length of exactly that header and those bytes."""
    path = os.path.join(root, FOLDER, f"{name}.npy")
    shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
    try:
        with open_input(path, f"{path} (under data.root)") as fh:
            version = np.lib.format.read_magic(fh)
            header = {(1, 0): np.lib.format.read_array_header_1_0,
                      (2, 0): np.lib.format.read_array_header_2_0}[version](fh)
            offset, size = fh.tell(), os.fstat(fh.fileno()).st_size
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{path}: not a readable .npy array ({type(e).__name__}: {e}); {REBUILD}") from None
    if header != (shape, False, dtype):
        raise InputError(f"{path}: holds a {header[2]} array of shape {header[0]}, the index records {dtype} "
                         f"{shape}; {REBUILD}")
    if size != offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise InputError(f"{path}: {size} bytes where its header announces {offset} + {shape} x {dtype.itemsize}; "
                         f"the file is truncated or damaged; {REBUILD}")
    return path, offset, shape, dtype


def _map(path, offset, shape, dtype):
    """The array's bytes memory-mapped read-only (nothing is read until a page is touched), as a plain ndarray
    (a np.memmap's slices cost ~40 us each in bookkeeping; the view keeps the mapping alive)."""
    if not int(np.prod(shape, dtype=np.int64)):     # mmap cannot map zero bytes
        return np.zeros(shape, dtype=dtype)
    check_input(path, f"{path} (under data.root)")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape).view(np.ndarray)


def _verify_bytes(path, offset, entry):
    """Reads the array's bytes once, in chunks through one buffer (so that checking maps nothing into this
    process), for their CRC-32 and, for token ids, their largest value; refuses damage and ids outside the
    vocabulary."""
    crc, largest, buffer = 0, 0, bytearray(CRC_CHUNK)
    with open_input(path, f"{path} (under data.root)") as fh:
        left = os.fstat(fh.fileno()).st_size - offset      # bounded by the size, whatever the file does
        fh.seek(offset)
        while left > 0:
            got = fh.readinto(memoryview(buffer)[:min(left, CRC_CHUNK)])
            left -= got
            if not got:
                break
            view = memoryview(buffer)[:got]
            crc = zlib.crc32(view, crc)
            if entry["dtype"] == np.dtype(np.uint8).str:
                largest = max(largest, int(np.frombuffer(view, dtype=np.uint8).max()))
    if crc != entry["crc32"]:
        raise InputError(f"{path}: its bytes do not match the CRC-32 its index records: the file is damaged; "
                         f"{REBUILD}")
    if largest >= VOCAB:
        raise InputError(f"{path}: token id {largest} outside the vocabulary 0..{VOCAB - 1}; {REBUILD}")


def _check_values(root, arrays):
    """The arrays make a data set: sizes that agree, token ids and labels in the vocabulary, user offsets that
    cut their index arrays, sample ids inside their sets."""
    def refuse(name, what):
        raise InputError(f"{os.path.join(root, FOLDER, name + '.npy')}: {what}; {REBUILD}")

    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim != 2 or x.shape[1] != SEQ or y.shape != (len(x),):
            refuse(f"x_{part}", f"shape {x.shape} with labels {y.shape}; expected N x {SEQ} ids and N labels")
        if len(y) and (y.min() < 0 or y.max() >= VOCAB):     # (the token ids were checked as they were read)
            refuse(f"y_{part}", f"labels outside the vocabulary 0..{VOCAB - 1}")
        key = "users" if part == "train" else "test_users"
        index, offsets = arrays[f"{key}_index"], arrays[f"{key}_offsets"]
        if (len(offsets) and (offsets[0] != 0 or offsets[-1] != len(index) or np.any(np.diff(offsets) < 0))) or \
                (not len(offsets) and len(index)):
            refuse(f"{key}_offsets", f"does not cut {key}_index ({len(index)} entries) into users")
        if len(index) and (index.min() < 0 or index.max() >= len(x)):
            refuse(f"{key}_index", f"sample ids outside the {part} set's 0..{len(x) - 1}")
    if len(arrays["users_offsets"]) != len(arrays["test_users_offsets"]):
        refuse("test_users_offsets", "a different number of users than users_offsets")
    if arrays["num_classes"].tolist() != [VOCAB]:
        refuse("num_classes", f"holds {arrays['num_classes'].tolist()}, expected [{VOCAB}]")


def read(root) -> dict:
    """The arrays of `root/binary/`, memory-mapped read-only, every check passed (see the module docstring)."""
    path, index = _index(root)
    found = json_fingerprint(root)
    if found and found != index["json"]:
        differ = sorted(set(found) ^ set(index["json"]) | {k for k in found if found[k] != index["json"].get(k)})
        raise InputError(f"{path}: was written from other LEAF files than those in {root} ({differ[0]} differs); "
                         f"the binary and the JSON would give different data sets; {REBUILD}")
    arrays = {}
    for name in DTYPES:
        entry = index["arrays"][name]
        where = _header(root, name, entry)
        _verify_bytes(where[0], where[1], entry)
        arrays[name] = _map(*where)
    _check_values(root, arrays)
    return arrays


def specs(root) -> dict:
    """{name: (shape, dtype)} of the checked arrays (what a node's first rank shares, fedmpi.data.shared)."""
    return {name: (a.shape, a.dtype) for name, a in read(root).items()}


def fill(root, arrays, part, parts):
    """Part `part` of `parts` reads its share of every array's rows from the files straight into `arrays` (the
    node's window, shaped by the first rank's checked `specs`): one copy, and nothing of the files mapped."""
    _, index = _index(root)
    for name, dest in arrays.items():
        path, offset, shape, _ = _header(root, name, index["arrays"][name])
        if shape != dest.shape:
            raise InputError(f"{path}: changed while the node loaded it; {REBUILD}")
        lo, hi = share_of(len(dest), part, parts)
        row = dest.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        target = memoryview(dest[lo:hi].reshape(-1)).cast("B")
        with open_input(path, f"{path} (under data.root)") as fh:
            fh.seek(offset + lo * row)
            done = 0
            while done < len(target):
                got = fh.readinto(target[done:])
                if not got:
                    raise InputError(f"{path}: ended early while the node loaded it; {REBUILD}")
                done += got
