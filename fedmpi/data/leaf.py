"""LEAF's FEMNIST and Shakespeare, read from the JSON files that LEAF's preprocessing writes.

Layout: `data.root/train/*.json` and `data.root/test/*.json`, each file
`{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`. The training
files' users become the natural clients (`Dataset.users`, in file-name order, then each file's `users`
order); all test files together form the test set, and each user's own test samples are its local test
split (`Dataset.test_users`, matched by user name; used under `partition.scheme: natural`).
"""

from __future__ import annotations

import glob
import os

import numpy as np

from fedmpi.core.config_checks import show
from fedmpi.core.errors import InputError
from fedmpi.core.input_files import parse_json, read_input
from fedmpi.data import leaf_binary
from fedmpi.data.dataset import Dataset, from_arrays

# LEAF's 80-character vocabulary (leaf/models/utils/language_utils.py); a character's id is its position.
SHAKESPEARE_VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SHAKESPEARE_SEQ = 80
TOKEN_DTYPE = np.uint8      # Shakespeare's input ids (80 of them); labels stay int64 as every source's
FEMNIST_CLASSES, FEMNIST_SIDE = 62, 28
LEAF_HOW = {
    "femnist": "run LEAF's data/femnist/preprocess.sh (github.com/TalwalkarLab/leaf), e.g. "
               "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample, and copy its data/train and data/test "
               "folders into data.root",
    "shakespeare": "run LEAF's data/shakespeare/preprocess.sh (github.com/TalwalkarLab/leaf), e.g. "
                   "./preprocess.sh -s niid --sf 0.2 -k 0 -t sample, and copy its data/train and data/test "
                   "folders into data.root",
}


def _json_files(data, part):
    name, root = data.name, data.root
    if not root:
        raise InputError(f"data.root is not set: data.name = {name!r} reads LEAF JSON files from "
                         f"DATA_ROOT/train/*.json and DATA_ROOT/test/*.json; {LEAF_HOW[name]}")
    folder = os.path.join(root, part)
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        raise InputError(f"data.name = {name!r}: expected LEAF JSON files {folder}/*.json "
                         f"(data.root = {show(root, 300)}); none found; {LEAF_HOW[name]}")
    return files


def _no_constants(path):
    """json's parse_constant hook: NaN and Infinity are not JSON, and no LEAF file holds them."""

    def refuse(word):
        raise InputError(f"{path}: holds {word}, which is not a valid value in a LEAF file (pixels are finite "
                         f"numbers)")

    return refuse


def _read_users(path, name):
    """[(user, x list, y list)] of one LEAF file, in its `users` order, and whether the file's text holds
    `true` or `false` anywhere (JSON booleans, which numpy would read as the numbers 1 and 0)."""
    try:
        raw = read_input(path, f"{path} (under data.root)")
        blob = parse_json(raw.decode("utf-8"), path, parse_constant=_no_constants(path))
        users, data = blob["users"], blob["user_data"]
        out = [(u, data[u]["x"], data[u]["y"]) for u in users]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise InputError(f"{path}: not a LEAF JSON file with keys users / num_samples / user_data{{user: "
                         f"{{x, y}}}} ({type(e).__name__}: {e}); {LEAF_HOW[name]}") from None
    for u, x, y in out:
        if not isinstance(x, list) or not isinstance(y, list):
            raise InputError(f"{path}: user {show(u)}: 'x' and 'y' must be lists, one entry per sample")
        if len(x) != len(y):
            raise InputError(f"{path}: user {show(u)} has {len(x)} inputs but {len(y)} labels")
    # A cheap test first: booleans can only be there if the words are (they may also be inside a string,
    # e.g. a user's name; then each user's values are looked at one by one).
    return out, b"true" in raw or b"false" in raw


def _first_boolean(rows):
    """Index of the first sample among `rows` (numbers, or lists of numbers) holding a JSON boolean, or None."""
    for i, row in enumerate(rows):
        if isinstance(row, bool) or (isinstance(row, list) and bool in set(map(type, row))):
            return i
    return None


def _read_part(data, part, encode):
    """(x, y, per-user index arrays, the users' names) of all files in `part`, users concatenated in order."""
    xs, ys, users, names, start = [], [], [], [], 0
    for path in _json_files(data, part):
        file_users, maybe_booleans = _read_users(path, data.name)
        for user, x, y in file_users:
            if not x:
                continue
            where = f"{path}: user {show(user)}"
            if maybe_booleans:
                for kind, rows in (("input 'x'", x), ("label 'y'", y)):
                    i = _first_boolean(rows)
                    if i is not None:
                        raise InputError(f"{where}, sample {i}: its {kind} holds true/false; LEAF values are "
                                         f"numbers (pixels) or strings (text), never booleans")
            xs.append(encode(x, y, where))
            ys.append(_labels(y, where))
            users.append(np.arange(start, start + len(y), dtype=np.int64))
            names.append(user)
            start += len(y)
    if not xs:
        raise InputError(f"{os.path.join(data.root, part)}: the LEAF files hold no samples")
    return np.concatenate(xs), np.concatenate(ys), users, names


def _test_users(train_names, test_users, test_names):
    """Each training user's own test samples (by user name; empty for a user without test samples)."""
    by_name = {}
    for name, idx in zip(test_names, test_users):
        by_name.setdefault(name, []).append(idx)
    empty = np.zeros(0, dtype=np.int64)
    return [np.concatenate(by_name[name]) if name in by_name else empty for name in train_names]


def _labels(y, path):
    try:
        labels = np.asarray(y)
    except (ValueError, TypeError):       # ragged nesting
        labels = None
    if labels is None or labels.ndim != 1 or labels.dtype == object:
        raise InputError(f"{path}: labels 'y' must be a flat list of one label per input")
    return labels


def _femnist_pixels(x, y, path):
    side2 = FEMNIST_SIDE * FEMNIST_SIDE
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError):       # ragged lists
        arr = None
    if arr is None or arr.dtype.kind not in "iuf":     # strings ("0.5" too), booleans, nulls, objects
        raise InputError(f"{path}: FEMNIST inputs 'x' must be lists of {side2} numbers each; found lists of "
                         f"other lengths or values that are not numbers")
    arr = arr.astype(np.float32)
    if arr.ndim != 2 or arr.shape[1] != side2:
        raise InputError(f"{path}: FEMNIST inputs must be lists of {side2} pixel values, found shape {arr.shape}")
    if not np.isfinite(arr).all():       # 1e999 in JSON reads as infinity
        raise InputError(f"{path}: FEMNIST pixel values must be finite numbers, found NaN or infinity")
    return arr.reshape(-1, 1, FEMNIST_SIDE, FEMNIST_SIDE)


def _check_labels(y, classes, where):
    if y.dtype.kind not in "iu" or (len(y) and (y.min() < 0 or y.max() >= classes)):
        raise InputError(f"{where}: labels must be integers in 0..{classes - 1}")
    return y.astype(np.int64)


def femnist(data) -> Dataset:
    """FEMNIST: 28x28 handwritten characters of 62 classes, one LEAF user per writer. LEAF stores pixels in
    [0, 1]; they are standardised with the training set's mean and standard deviation."""
    x_tr, y_tr, users, names = _read_part(data, "train", _femnist_pixels)
    x_te, y_te, test_users, test_names = _read_part(data, "test", _femnist_pixels)
    mean, std = float(x_tr.mean()), float(x_tr.std()) or 1.0
    y_tr = _check_labels(y_tr, FEMNIST_CLASSES, os.path.join(data.root, "train"))
    y_te = _check_labels(y_te, FEMNIST_CLASSES, os.path.join(data.root, "test"))
    return Dataset("femnist", (x_tr - mean) / std, y_tr, (x_te - mean) / std, y_te, FEMNIST_CLASSES, users=users,
                   test_users=_test_users(names, test_users, test_names))


def encode_chars(strings, dtype=np.int64) -> np.ndarray:
    """Characters -> ids in SHAKESPEARE_VOCAB (vectorised), of `dtype`. A character outside the vocabulary
    becomes the space's id, as no LEAF model can embed it."""
    text = "".join(strings)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.full(max(int(codes.max(initial=0)), 127) + 1, SHAKESPEARE_VOCAB.index(" "), dtype=dtype)
    table[[ord(c) for c in SHAKESPEARE_VOCAB]] = np.arange(len(SHAKESPEARE_VOCAB))
    return table[codes]


def _shakespeare_tokens(x, y, path):
    if any(not isinstance(s, str) or len(s) != SHAKESPEARE_SEQ for s in x):
        raise InputError(f"{path}: Shakespeare inputs must be strings of {SHAKESPEARE_SEQ} characters")
    if any(not isinstance(s, str) or len(s) != 1 for s in y):
        raise InputError(f"{path}: Shakespeare labels must be single characters")
    for kind, strings in (("input 'x'", x), ("label 'y'", y)):
        i = _first_surrogate(strings)
        if i is not None:
            raise InputError(f"{path}, sample {i}: its {kind} holds a lone surrogate (a \\ud800-\\udfff escape "
                             f"that is half of a character), which is not text; LEAF's files hold UTF-8 text")
    return encode_chars(x, TOKEN_DTYPE).reshape(-1, SHAKESPEARE_SEQ)


def _first_surrogate(strings):
    """Index of the first string holding a lone surrogate (JSON's "\\ud800" reads as one; it cannot be encoded),
    or None. One pass over the joined text finds whether there is any at all."""
    try:
        "".join(strings).encode("utf-32-le")
        return None
    except UnicodeEncodeError:
        pass
    for i, text in enumerate(strings):
        try:
            text.encode("utf-32-le")
        except UnicodeEncodeError:
            return i
    return None


def shakespeare(data) -> Dataset:
    """Shakespeare next-character prediction: 80 characters in, the next character out (80 classes), one LEAF
    user per speaking role. Inputs are uint8 token ids (the vocabulary has 80: an eighth of int64's memory,
    2.2 GB less for the full build), labels int64. A binary form beside the JSON (`fedmpi data shakespeare`
    writes one) is memory-mapped instead of parsing the JSON: the same arrays, in seconds."""
    if leaf_binary.present(data.root):
        return from_arrays("shakespeare", leaf_binary.read(data.root))
    x_tr, y_tr, users, names = _read_part(data, "train", _shakespeare_tokens)
    x_te, y_te, test_users, test_names = _read_part(data, "test", _shakespeare_tokens)
    y_tr, y_te = encode_chars(list(y_tr)), encode_chars(list(y_te))
    return Dataset("shakespeare", x_tr, y_tr, x_te, y_te, len(SHAKESPEARE_VOCAB), users=users,
                   test_users=_test_users(names, test_users, test_names))
