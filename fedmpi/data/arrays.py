"""`data.name: arrays`: a data set from files a researcher already has, `data.root` being

  an .npz file       np.load with allow_pickle=False (object arrays are refused, never unpickled);
  an HDF5 file       (.h5, .hdf5) with datasets x_train, y_train, x_test, y_test, optional client_train,
                     client_test and num_classes;
  a folder           a Hugging Face `datasets` DatasetDict saved with save_to_disk, splits `train` and `test`
                     (the optional extra fedmpi[hf]); read from its Arrow files by datasets.load_from_disk (no
                     pickle). `data.columns` names the columns: {x: ..., y: ..., client: ...} (defaults x, y,
                     and no client column). An Image column becomes float32 N x C x H x W in [0, 1].

The arrays then go through the same checks as a plug-in's (fedmpi.data.checked_arrays). The .npz's and the
HDF5 file's shapes and dtypes are read first: arrays beyond this node's memory are refused before any is
read (fedmpi.data.array_sizes).
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.input_files import check_input, open_input
from fedmpi.data.array_sizes import refuse_beyond_memory
from fedmpi.data.checked_arrays import OPTIONAL, REQUIRED, dataset_from_mapping
from fedmpi.data.dataset import Dataset

COLUMN_ROLES = ("x", "y", "client")
DEFAULT_COLUMNS = {"x": "x", "y": "y", "client": None}
HDF5_SUFFIXES = (".h5", ".hdf5")


def arrays(data) -> Dataset:
    root = data.root
    if not root:
        raise InputError("data.root is not set: data.name = 'arrays' reads an .npz or HDF5 (.h5, .hdf5) file, or "
                         "a folder a Hugging Face data set was saved to (save_to_disk)")
    where = f"data.root = {show(root, 300)}"
    if os.path.isdir(root):
        mapping = _hugging_face(root, data.columns, where)
    elif not os.path.exists(root):
        raise InputError(f"{where}: no such file or folder")
    elif root.endswith(".npz"):
        mapping = _npz(root, where)
    elif root.endswith(HDF5_SUFFIXES):
        mapping = _hdf5(root, where)
    else:
        raise InputError(f"{where}: not an .npz or HDF5 file (by its suffix: .npz, .h5, .hdf5) nor a folder "
                         f"holding a saved Hugging Face data set")
    return dataset_from_mapping("arrays", mapping, where)


def _npz(path, where):
    try:    # every read below through this one descriptor of a regular file (fedmpi.core.input_files)
        fh = open_input(path, where)
    except OSError as e:
        raise InputError(f"{where}: cannot be read ({e.strerror or e})") from None
    with fh:
        if not zipfile.is_zipfile(fh):    # np.load would take other bytes for a pickle and say so
            raise InputError(f"{where}: not a valid .npz file (a zip archive of .npy arrays, as np.savez writes)")
        try:
            refuse_beyond_memory(_npz_specs(fh), where)
            fh.seek(0)
            with np.load(fh, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files if k in REQUIRED + OPTIONAL}
        except ValueError as e:     # an object array, which would need unpickling
            raise InputError(f"{where}: {e}; save plain numeric arrays (np.savez)") from None
        except (OSError, EOFError, zipfile.BadZipFile) as e:
            raise InputError(f"{where}: not a readable .npz file ({type(e).__name__}: {e})") from None


def _npz_specs(fh):
    """{key: (shape, dtype)} of the .npz's arrays (`fh`, its open file), from their .npy headers alone (object
    arrays and header versions numpy has no public reader for are left to np.load)."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    specs = {}
    with zipfile.ZipFile(fh) as archive:
        for name in archive.namelist():
            key = name[:-len(".npy")] if name.endswith(".npy") else name
            if key not in REQUIRED + OPTIONAL:
                continue
            with archive.open(name) as fh:
                reader = readers.get(np.lib.format.read_magic(fh))
                if reader is not None:
                    shape, _, dtype = reader(fh)
                    if not dtype.hasobject:
                        specs[key] = (shape, dtype)
    return specs


def _hdf5(path, where):
    import h5py

    try:
        check_input(path, where)
        with h5py.File(path, "r", locking=False) as f:
            for key in REQUIRED + OPTIONAL:
                if key in f and not isinstance(f[key], h5py.Dataset):
                    raise InputError(f"{where}: {key} is an HDF5 group; expected a dataset (array)")
            present = [key for key in REQUIRED + OPTIONAL if key in f]
            # Shapes first: a dataset may declare far more than the file holds (chunked, compressed, unwritten).
            refuse_beyond_memory({key: (f[key].shape, f[key].dtype) for key in present}, where)
            return {key: np.asarray(f[key][()]) for key in present}
    except OSError as e:
        raise InputError(f"{where}: not a readable HDF5 file ({e})") from None


def check_columns(columns):
    """Problems of `data.columns` (a mapping of roles x, y, client to column names), one line each."""
    if not isinstance(columns, dict):
        return [f"data.columns = {show(columns)}: must be a mapping {{x: COLUMN, y: COLUMN, client: COLUMN}}"]
    problems = []
    for role, column in columns.items():
        if role not in COLUMN_ROLES:
            problems.append(f"data.columns.{role}: unknown role; the roles are {', '.join(COLUMN_ROLES)}")
        elif not (isinstance(column, str) and column) and not (role == "client" and column is None):
            problems.append(f"data.columns.{role} = {show(column)}: must be a column name")
    return problems


def _hugging_face(root, columns, where):
    try:
        import datasets
    except ImportError:
        raise InputError(f"{where}: a folder is read as a Hugging Face data set, which needs the datasets "
                         f"package: pip install 'fedmpi[hf]' (or pip install datasets)") from None
    names = {**DEFAULT_COLUMNS, **columns}
    try:
        saved = datasets.load_from_disk(root)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise InputError(f"{where}: not a Hugging Face data set saved with save_to_disk ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0][:200]})") from None
    if not isinstance(saved, datasets.DatasetDict) or not {"train", "test"} <= set(saved):
        raise InputError(f"{where}: expected a DatasetDict with splits train and test (save_to_disk of "
                         f"DatasetDict({{'train': ..., 'test': ...}})), found "
                         f"{', '.join(saved) if isinstance(saved, datasets.DatasetDict) else 'a single Dataset'}")
    out = {}
    for split in ("train", "test"):
        part = saved[split]
        for role, key in (("x", f"x_{split}"), ("y", f"y_{split}"), ("client", f"client_{split}")):
            column = names[role]
            if column is None:
                continue
            if column not in part.column_names:
                raise ConfigError(f"data.columns.{role} = {show(column)}: the {split} split of {where} has no "
                                  f"such column; its columns: {', '.join(part.column_names)}")
            out[key] = _column(part, column, datasets, f"{where}, split {split}, column {column!r}")
    return out


def _column(part, column, datasets, where):
    """One column as a numpy array; images decoded to float32 N x C x H x W in [0, 1]."""
    feature = part.features[column]
    if isinstance(feature, datasets.Image):
        images = [np.asarray(img) for img in part[column]]
        try:
            stack = np.stack(images)
        except ValueError:
            raise InputError(f"{where}: the images differ in size; fedmpi needs images of one size") from None
        stack = stack[:, None] if stack.ndim == 3 else stack.transpose(0, 3, 1, 2)
        return (stack.astype(np.float32) / 255.0).astype(np.float32)
    ragged = InputError(f"{where}: holds rows of different lengths or non-numeric values; fedmpi needs one "
                        f"fixed-shape numeric array per column (every row of one shape, numbers only)")
    values = part.with_format("numpy")[column]
    if isinstance(values, list) or getattr(getattr(values, "dtype", None), "kind", "") == "O":
        raise ragged
    try:        # newer `datasets` give a lazy column, which numpy stacks only here
        values = np.asarray(values)
    except (ValueError, TypeError):
        raise ragged from None
    if values.dtype.kind == "O":
        raise ragged
    return values
