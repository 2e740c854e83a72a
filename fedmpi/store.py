"""The HDF5 run log `OUT/run.h5` (DESIGN §3, contract); the only module that writes HDF5 run logs.

Written by rank 0 only. `append` keeps the file open from one round to the next (reopening it each round
cost ~1.5 ms, a tenth of a round of many tiny clients) and flushes it after every row; every other write
closes that handle and opens, writes and closes the file as before. So between rounds the file is
complete on disk: a running job's log can be read by `fedmpi report` or `tools/`, and a crashed job
leaves every finished round behind. The appending handle takes no HDF5 file lock and readers open with
locking off (`open_run`), so neither blocks the other; in the writing process itself, another handle
on the file during the run must also use locking=False (HDF5 refuses mixed flags).
"""

from __future__ import annotations

import os
import platform
import socket
import time
from datetime import datetime, timezone

import h5py
import numpy as np

import fedmpi
from fedmpi.timing import PHASES

# The figures every run logs each round (NaN where not measured that round).
CORE_METRICS = ("round", "test_acc", "test_loss", "train_loss", "wall_s", "bytes_up", "bytes_down", "uploads")
READ_RETRIES = 5


def _versions():
    import mpi4py
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "h5py": h5py.__version__, "mpi4py": mpi4py.__version__}


class RunLog:
    """Appends per-round metrics and per-client figures to OUT/run.h5."""

    def __init__(self, path, metric_attrs=None):
        self.path = path
        self._f = None      # the handle `append` keeps open between rounds; closed by every other write
        # Attributes of /metrics datasets, set when each is created (class_acc's class_counts, ...).
        self.metric_attrs = dict(metric_attrs or {})

    def _file(self):
        if self._f is None:
            self._f = h5py.File(self.path, "a", locking=False)
        return self._f

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None

    @classmethod
    def create(cls, path, cfg, world_size, hosts, partition_groups, extra_attrs=None):
        """Writes a fresh run.h5 (to a temporary name first, so a half-made file never has the real name)."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = path + ".tmp"
        with h5py.File(tmp, "w") as f:
            f.attrs["config"] = cfg.to_yaml()
            f.attrs["config_hash"] = cfg.hash()
            f.attrs["fedmpi_version"] = fedmpi.__version__
            f.attrs["world_size"] = world_size
            f.attrs["status"] = "running"
            f.attrs["error"] = ""
            f.attrs["started"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            f.attrs["hosts"] = ",".join(sorted(set(hosts))) or socket.gethostname()
            for k, v in _versions().items():
                f.attrs[f"version_{k}"] = str(v)
            for k, v in (extra_attrs or {}).items():
                f.attrs[k] = v
            metrics = f.create_group("metrics")
            for name in CORE_METRICS:
                _growable(metrics, name)
            f.create_group("clients")
            for group, datasets in partition_groups.items():
                g = f.require_group(group)
                for name, value in datasets.items():
                    g.create_dataset(name, data=np.asarray(value))
            _fsync(f)
        os.replace(tmp, path)
        return cls(path)

    def append(self, metrics: dict, clients: dict | None = None, num_clients=None, timing=None):
        """One row: `metrics` maps name -> a float (missing core figures become NaN; new names get a column
        padded with NaN for earlier rounds), a string (/metrics/model_sha256) or a 1-D array (a row of a
        [round, k] figure such as class_acc); `clients` maps name -> [num_clients] array; `timing` is the
        round's [rank, phase] seconds (/timing/<phase> [round, rank])."""
        f = self._file()
        group = f["metrics"]
        n = group["round"].shape[0]
        for name in set(metrics) - set(group):
            _metric_dataset(group, name, metrics[name], n, self.metric_attrs.get(name, {}))
        for name, ds in group.items():
            ds.resize((n + 1,) + ds.shape[1:])
            ds[n] = _cell(ds, metrics.get(name))
        for name, row in (clients or {}).items():
            ds = f["clients"].get(name)
            if ds is None:
                ds = f["clients"].create_dataset(name, shape=(n, num_clients), maxshape=(None, num_clients),
                                                 dtype="f4", fillvalue=np.nan, chunks=(64, num_clients))
            ds.resize((n + 1, num_clients))
            ds[n] = row
        for ds in f["clients"].values():
            if ds.shape[0] < n + 1:
                ds.resize((n + 1, ds.shape[1]))
        if timing is not None:
            group = f.require_group("timing")
            for i, phase in enumerate(PHASES):
                ds = group.get(phase)
                if ds is None:
                    ds = group.create_dataset(phase, shape=(n, timing.shape[0]), maxshape=(None, timing.shape[0]),
                                              dtype="f8", fillvalue=np.nan, chunks=(256, timing.shape[0]))
                ds.resize((n + 1, ds.shape[1]))
                ds[n] = timing[:, i] if timing.shape[0] == ds.shape[1] else np.nan
        f.flush()

    def write_model(self, vec):
        """The newest global model as `/model/global` (float32), replaced each time it is written."""
        self.close()
        with h5py.File(self.path, "a") as f:
            g = f.require_group("model")
            if "global" in g:
                del g["global"]
            g.create_dataset("global", data=np.asarray(vec, dtype=np.float32))

    @classmethod
    def reopen(cls, path, rounds_kept, **attrs):
        """An existing run.h5 continued by --resume: rows after the first `rounds_kept` dropped (the resumed
        run recomputes them), status back to running, `attrs` updated, the resume noted in `resumes`."""
        log = cls(path)
        log.truncate(rounds_kept)
        with h5py.File(path, "a") as f:
            history, previous = str(f.attrs.get("resumes", "")), str(f.attrs.get("status", ""))
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        # A previous status `running` means that job was killed without a word (e.g. SIGKILL).
        entry = (f"{when} from round {rounds_kept} at world_size {attrs.get('world_size', '?')} "
                 f"(previous status {previous})")
        log.set_attrs(status="running", error="", error_detail="", resumes=(history + "\n" + entry).strip(), **attrs)
        return log

    def truncate(self, rounds_kept):
        """Drops rows after the first `rounds_kept` (a resume recomputes them)."""
        self.close()
        with h5py.File(self.path, "a") as f:
            for ds in (list(f["metrics"].values()) + list(f["clients"].values())
                       + list(f.get("timing", {}).values())):
                ds.resize((min(rounds_kept, ds.shape[0]),) + ds.shape[1:])

    def set_attrs(self, **attrs):
        self.close()
        with h5py.File(self.path, "a") as f:
            for k, v in attrs.items():
                f.attrs[k] = v
            f.attrs["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def finish(self, status, error=""):
        self.set_attrs(status=status, error=error)


def _metric_dataset(group, name, value, length, attrs):
    """A growable /metrics dataset shaped for `value`: text (S64), a [round, k] row, or one float per round."""
    if isinstance(value, (str, bytes)):
        ds = group.create_dataset(name, shape=(length,), maxshape=(None,), dtype="S64", chunks=(256,), fillvalue=b"")
    elif np.ndim(value) == 1:
        k = len(value)
        ds = group.create_dataset(name, shape=(length, k), maxshape=(None, k), dtype="f8", chunks=(256, k),
                                  fillvalue=np.nan)
    else:
        ds = _growable(group, name, length)
    for key, v in attrs.items():
        ds.attrs[key] = v
    return ds


def _cell(ds, value):
    """What a row of `ds` holds for `value` (None: not measured this round)."""
    if ds.dtype.kind == "S":
        return (value or "").encode() if isinstance(value, str) else (value or b"")
    if value is None:
        return np.full(ds.shape[1:], np.nan) if ds.ndim > 1 else np.nan
    return value


def _growable(group, name, length=0):
    return group.create_dataset(name, shape=(length,), maxshape=(None,), dtype="f8", chunks=(256,),
                                fillvalue=np.nan)


def _fsync(f):
    f.flush()
    try:
        os.fsync(f.id.get_vfd_handle())
    except (OSError, ValueError, TypeError):
        pass


def open_run(path):
    """Opens a run file read-only without taking HDF5's lock, retrying while the writer is mid-append."""
    last = None
    for attempt in range(READ_RETRIES):
        try:
            return h5py.File(path, "r", locking=False)
        except OSError as e:
            last = e
            time.sleep(0.05 * (attempt + 1))
    raise last
