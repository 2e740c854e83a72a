"""A mapping of numpy arrays from outside fedmpi (a plug-in's return value, an .npz, HDF5 or Hugging Face file)
checked and turned into a Dataset.

The mapping holds `x_train`, `y_train`, `x_test`, `y_test`, optionally `client_train` / `client_test` (each
sample's natural client id, any integers) and `num_classes` (a scalar; default: the largest label + 1).
Inputs are float features or images (cast to float32, which must leave them finite) or integer token ids (kept
as int64); labels are integers in [0, num_classes). Client ids become the natural users (`Dataset.users`, in
increasing id order, as `partition.scheme: natural` deals them) and, with `client_test`, each user's own test
samples (`Dataset.test_users`, matched by id; a user without test samples gets an empty split, test ids
without training samples stay in the global test set only).

Every problem is an InputError (exit 2) naming `where` (the config key and its value) and what was wrong, raised
before the data set is shared, partitioned or anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedmpi.core.errors import InputError
from fedmpi.data.dataset import Dataset

REQUIRED = ("x_train", "y_train", "x_test", "y_test")
OPTIONAL = ("client_train", "client_test", "num_classes")


def dataset_from_mapping(name, arrays, where) -> Dataset:
    """The checked Dataset `name` of `arrays`; `where` names the source in errors, e.g. "data.name = 'pkg:f'"."""
    if not isinstance(arrays, Mapping):
        raise InputError(f"{where}: returned a {type(arrays).__name__}; expected a mapping of numpy arrays "
                         f"with keys {', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})")
    missing = [k for k in REQUIRED if k not in arrays]
    if missing:
        raise InputError(f"{where}: no {', '.join(missing)}; expected keys {', '.join(REQUIRED)} (optional: "
                         f"{', '.join(OPTIONAL)}), found {', '.join(map(str, list(arrays)[:10])) or 'none'}")
    arrays = _scalar_classes_as_array(arrays)
    for key in (*REQUIRED, *OPTIONAL):
        if key in arrays and arrays[key] is not None and not isinstance(arrays[key], np.ndarray):
            raise InputError(f"{where}: {key} is a {type(arrays[key]).__name__}, not a numpy array")
    x_train, x_test = _inputs(arrays["x_train"], "x_train", where), _inputs(arrays["x_test"], "x_test", where)
    if x_train.shape[1:] != x_test.shape[1:] or x_train.dtype != x_test.dtype:
        raise InputError(f"{where}: x_train's samples are {x_train.shape[1:]} {x_train.dtype}, x_test's "
                         f"{x_test.shape[1:]} {x_test.dtype}; both sets need samples of one shape and kind")
    y_train, y_test = _labels(arrays["y_train"], "y_train", where), _labels(arrays["y_test"], "y_test", where)
    for part, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if len(x) != len(y):
            raise InputError(f"{where}: x_{part} has {len(x)} samples but y_{part} {len(y)} labels")
    if not len(y_train):
        raise InputError(f"{where}: the training set is empty")
    classes = _classes(arrays.get("num_classes"), y_train, y_test, where)
    users = test_users = None
    ids = _client_ids(arrays.get("client_train"), len(y_train), "client_train", "y_train", where)
    test_ids = _client_ids(arrays.get("client_test"), len(y_test), "client_test", "y_test", where)
    if test_ids is not None and ids is None:
        raise InputError(f"{where}: client_test without client_train; the natural clients are the ids of "
                         f"client_train (give both, or neither)")
    if ids is not None:
        order, users_ids = _grouped(ids)
        users = order
        if test_ids is not None:
            test_groups, test_user_ids = _grouped(test_ids)
            by_id = dict(zip(test_user_ids.tolist(), test_groups))
            empty = np.zeros(0, dtype=np.int64)
            test_users = [by_id.get(u, empty) for u in users_ids.tolist()]
    return Dataset(name, x_train, y_train, x_test, y_test, classes, users=users, test_users=test_users)


def _scalar_classes_as_array(arrays):
    """`arrays` with a plain `num_classes` (a Python int or numpy integer, as a data function naturally
    returns it) as a 0-d array, so that it takes the same checks as an array one (bool stays refused there)."""
    given = arrays.get("num_classes")
    if isinstance(given, (int, np.integer)):
        return {**arrays, "num_classes": np.asarray(given)}
    return arrays


def _inputs(x, key, where):
    """float32 features/images, or int64 token ids; finite, at least one feature axis."""
    if x.ndim < 2 or 0 in x.shape[1:]:
        raise InputError(f"{where}: {key} has shape {x.shape}; expected one row per sample with at least one "
                         f"feature axis (N x D features, N x C x H x W images or N x T tokens)")
    if x.dtype.kind in "iu":
        return x.astype(np.int64, copy=False)
    if x.dtype.kind != "f":
        raise InputError(f"{where}: {key} has dtype {x.dtype}; inputs must be floating point (features, images) "
                         f"or integer token ids")
    with np.errstate(over="ignore", invalid="ignore"):      # float64 beyond float32's range: refused just below
        out = x.astype(np.float32, copy=False)
    if not np.isfinite(out).all():
        bad = int(np.flatnonzero(~np.isfinite(out.reshape(len(out), -1)).all(axis=1))[0])
        raise InputError(f"{where}: {key} holds NaN or infinite values as float32 (first in sample {bad}); "
                         f"inputs must be finite numbers")
    return out


def _labels(y, key, where):
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise InputError(f"{where}: {key} has shape {y.shape} and dtype {y.dtype}; labels must be one integer "
                         f"per sample (a 1-D integer array)")
    if len(y) and y.min() < 0:
        raise InputError(f"{where}: {key} holds the label {int(y.min())}; labels must be integers >= 0")
    return y.astype(np.int64, copy=False)


def _classes(given, y_train, y_test, where):
    top = int(max(y_train.max(), y_test.max(initial=0))) + 1
    if given is None:
        return max(top, 2)
    if given.size != 1 or given.dtype.kind not in "iu" or int(given.reshape(-1)[0]) < 2:
        raise InputError(f"{where}: num_classes = {given!r}; must be one integer >= 2")
    classes = int(given.reshape(-1)[0])
    if top > classes:
        raise InputError(f"{where}: labels must lie in 0..{classes - 1} (num_classes = {classes}), found "
                         f"labels up to {top - 1}")
    return classes


def _client_ids(ids, n, key, of, where):
    if ids is None:
        return None
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise InputError(f"{where}: {key} has shape {ids.shape} and dtype {ids.dtype}; client ids must be one "
                         f"integer per sample (a 1-D integer array)")
    if len(ids) != n:
        raise InputError(f"{where}: {key} has {len(ids)} client ids but {of} has {n} samples; one id per sample")
    return ids.astype(np.int64, copy=False)


def _grouped(ids):
    """(each distinct id's sample indices, ascending, in increasing id order; the distinct ids)."""
    distinct, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable").astype(np.int64)
    cuts = np.cumsum(np.bincount(inverse, minlength=len(distinct)))[:-1]
    return np.split(order, cuts), distinct
