"""The HDF5 run log `OUT/run.h5` (docs/explanation/design.md §3, contract); the only module that writes HDF5 run logs.

Per-client figures are stored as rows of the clients a round names, not as [round, client]
matrices: /clients/ids [round, width] int32 (-1 pads a short row) and /clients/<name> [round, width]
float32 beside it, where `width` grows to the longest row. A round names the clients where any figure
differs from its `fill` (0 for the indicators selected / dropped / late / arrived, NaN for the rest): the
selected ones, and e.g. FedBuff's arrivals. The group's attributes say `layout = "rows"` and
`num_clients`; each dataset's `fill` attribute is what a client left out of a row reads as. So the file
grows with the clients selected, not with N. `client_table` reads either this layout or the dense
[round, client] datasets of older files as the same [round, client] view; a resumed or forked old file
keeps its dense layout.

Written by rank 0 only. `append` / `append_rows` keep the file open from one write to the next (reopening
it each round cost ~1.5 ms, a tenth of a round of many tiny clients) and flush it after every batch of
rows (the run loop writes batches at most `runtime.log_flush_s` apart, fedmpi.run.rows: HDF5 charges
~0.4 ms per dataset and call, whatever the rows' count); every other write closes that handle and opens,
writes and closes the file as before. So between batches the file is complete on disk: a running job's
log can be read by `fedmpi report` or `tools/`, and a job that fails or is stopped leaves every finished
round behind (one killed outright loses at most the rows of the last `log_flush_s`, which lie after its
newest checkpoint: a --resume recomputes them). The appending handle takes no HDF5 file lock and readers open with
locking off (`open_run`), so neither blocks the other; in the writing process itself, another handle
on the file during the run must also use locking=False (HDF5 refuses mixed flags).

(Room on disk: fedmpi.io.disk_room.) The final model goes into a
copy of the file that replaces it once complete: whatever goes wrong there, run.h5 is the old file or
the new one.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import h5py
import numpy as np

import fedmpi
from fedmpi.core.input_files import check_input
from fedmpi.core.output_paths import temp_beside
from fedmpi.core.timing import PHASES
from fedmpi.io import write_errors
from fedmpi.io.client_rows import (
    CLIENT_CHUNK,
    ROWS,
    append_dense,
    append_rows,
    client_row,
    client_table,
    dense_layout,
    rows_room,
)
from fedmpi.io.disk_room import ATTR_SLACK_BYTES, WriteFailed, ensure_room
from fedmpi.io.metric_rows import (
    METRIC_CHUNK,
    append_timing,
    cell,
    chunk_bytes,
    growable,
    metric_dataset,
    new_metric_chunk,
)
from fedmpi.mpi import signals

# The figures every run logs each round (NaN where not measured that round).
CORE_METRICS = ("round", "test_acc", "test_loss", "train_loss", "wall_s", "bytes_up", "bytes_down", "uploads")
READ_RETRIES = 5


@dataclass(frozen=True)
class LogRow:
    """One round's row for `RunLog.append_rows`: as `RunLog.append`'s arguments."""

    metrics: dict
    clients: dict | None = None
    timing: np.ndarray | None = None


def _versions():
    import mpi4py
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "h5py": h5py.__version__, "mpi4py": mpi4py.__version__}


def _held(method):
    """Runs a write with SIGINT/SIGTERM/SIGUSR1 held back (fedmpi.mpi.signals.held): h5py frees its objects through
    weakref callbacks, and a Ctrl-C whose KeyboardInterrupt is raised inside one is swallowed, so a run
    interrupted during its final model write used to end `finished`, exit 0. Held, the interrupt is raised
    when the write is complete and the run ends `interrupted`, exit 130."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with signals.held():
            return method(*args, **kwargs)
    return wrapper


class RunLog:
    """Appends per-round metrics and per-client figures to OUT/run.h5."""

    def __init__(self, path, metric_attrs=None):
        self.path = path
        self._f = None      # the handle `append` keeps open between rounds; closed by every other write
        self.chunk_bytes = {}  # group -> bytes of one chunk of each of its datasets: what a new chunk row adds
        # Attributes of /metrics datasets, set when each is created (class_acc's class_counts, ...).
        self.metric_attrs = dict(metric_attrs or {})

    def _file(self):
        if self._f is None:
            with _writing(self.path):
                self._f = h5py.File(self.path, "a", locking=False)
            self.chunk_bytes = {group: sum(chunk_bytes(ds) for ds in self._f.get(group, {}).values())
                                 for group in ("metrics", "clients", "timing")}
        return self._f

    def close(self):
        if self._f is not None:
            f, self._f = self._f, None
            with _writing(self.path) as writing:
                writing.handle = f
                f.close()

    @classmethod
    @_held
    def create(cls, path, cfg, world_size, hosts, partition_groups, extra_attrs=None):
        """Writes a fresh run.h5 (to a temporary name first, so a half-made file never has the real name)."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        need = sum(np.asarray(v).nbytes for datasets in partition_groups.values() for v in datasets.values())
        with _writing(path) as writing:
            # A unique new name (never a link planted at a fixed name such as run.h5.tmp), renamed into place.
            tmp = writing.discard = temp_beside(path)
            ensure_room(path, need + len(cfg.to_yaml()) + len(CORE_METRICS) * METRIC_CHUNK * 8, tmp)
            writing.handle = h5py.File(tmp, "w")
            cls._fill_new(writing.handle, cfg, world_size, hosts, partition_groups, extra_attrs)
            writing.handle.close()
            os.replace(tmp, path)
        return cls(path)

    @staticmethod
    def _fill_new(f, cfg, world_size, hosts, partition_groups, extra_attrs):
        """The fresh run file's attributes and groups, into the open temporary file `f`."""
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
            growable(metrics, name)
        f.create_group("clients")
        for group, datasets in partition_groups.items():
            g = f.require_group(group)
            g.attrs.update(getattr(datasets, "attrs", {}))     # e.g. /attack's name and keys
            for name, value in datasets.items():
                g.create_dataset(name, data=np.asarray(value))
        _fsync(f)

    def append(self, metrics: dict, clients: dict | None = None, num_clients=None, timing=None):
        """One row: `metrics` maps name -> a float (missing core figures become NaN; new names get a column
        padded with NaN for earlier rounds), a string (/metrics/model_sha256) or a 1-D array (a row of a
        [round, k] figure such as class_acc); `clients` maps name -> [num_clients] array; `timing` is the
        round's [rank, phase] seconds (/timing/<phase> [round, rank])."""
        self.append_rows([LogRow(metrics, clients, timing)], num_clients)

    @_held
    def append_rows(self, rows, num_clients=None):
        """Rows (`LogRow`s, in round order) as `append` writes them one by one, with one resize and one write
        per dataset for all of them (HDF5 charges ~0.4 ms per dataset and call, whatever the rows' count)."""
        if not rows:
            return
        f = self._file()
        group, k = f["metrics"], len(rows)
        n = group["round"].shape[0]
        new_metrics = {}
        for row in rows:
            for name, value in row.metrics.items():
                if name not in group and name not in new_metrics:
                    new_metrics[name] = value
        dense = dense_layout(f["clients"])
        per_row = [client_row(row.clients or {}, num_clients or 0) for row in rows] if not dense else None
        names = dict.fromkeys(name for row in rows for name in (row.clients or {}))
        new_clients = [name for name in names if name not in f["clients"]]
        timed = [row.timing for row in rows if row.timing is not None]
        new_timing = bool(timed) and "timing" not in f
        grown = {"metrics": sum(new_metric_chunk(v) for v in new_metrics.values()),
                 "clients": len(new_clients) * CLIENT_CHUNK * (num_clients or 0) * 4 if dense else 0,
                 "timing": len(PHASES) * METRIC_CHUNK * 8 * timed[0].shape[0] if new_timing else 0}
        # Row i starts a new chunk of every dataset of a group when n + i is a multiple of its chunk rows; new
        # datasets start theirs now. Checked before anything changes: a refused batch leaves no trace.
        need = sum(grown.values())
        widest = max((len(ids) for ids, _ in per_row), default=0) if per_row else 0
        for i in range(k):
            if (n + i) % METRIC_CHUNK == 0:
                need += self.chunk_bytes["metrics"] + self.chunk_bytes["timing"]
            if dense:
                need += self.chunk_bytes["clients"] if (n + i) % CLIENT_CHUNK == 0 else 0
            else:
                need += rows_room(f["clients"], n + i, widest, len(new_clients) if i == 0 else 0)
        try:
            ensure_room(self.path, need)
        except WriteFailed:
            if k == 1:
                raise
            for row in rows:        # no room for the batch: row by row, so that every row that fits lands
                self.append_rows([row], num_clients)
            return
        for name, more in grown.items():
            self.chunk_bytes[name] += more
        with _writing(self.path) as writing:
            writing.handle, self._f = f, None       # (back once the batch is in: a failed one loses the handle)
            write_errors.inject("rows", self.path)
            for name, value in new_metrics.items():
                metric_dataset(group, name, value, n, self.metric_attrs.get(name, {}))
            for name, ds in group.items():
                ds.resize((n + k,) + ds.shape[1:])
                ds[n:n + k] = np.array([cell(ds, row.metrics.get(name)) for row in rows], dtype=ds.dtype)
            if dense:
                for i, row in enumerate(rows):
                    append_dense(f["clients"], n + i, row.clients or {}, num_clients)
            else:
                append_rows(f["clients"], n, [ids for ids, _ in per_row], [values for _, values in per_row],
                            num_clients)
            if timed:
                append_timing(f.require_group("timing"), n, [row.timing for row in rows])
            f.flush()
        self._f = f

    @_held
    def write_model(self, vec):
        """The newest global model as `/model/global` (float32), replaced each time it is written.

        Written into a copy of run.h5 that replaces it once complete (a model is written once or twice per
        run, at its end): whatever goes wrong, run.h5 is either the old file or the new one."""
        self.close()
        model = np.asarray(vec, dtype=np.float32)
        with _writing(self.path) as writing:
            tmp = writing.discard = temp_beside(self.path)      # unique, new: never a planted link
            ensure_room(self.path, os.path.getsize(self.path) + model.nbytes, tmp)
            with open(self.path, "rb") as src, open(tmp, "r+b") as dst:    # r+b: no truncation of the reservation
                shutil.copyfileobj(src, dst, 1 << 20)
            write_errors.inject("model", self.path)
            f = writing.handle = h5py.File(tmp, "a")
            g = f.require_group("model")
            if "global" in g:
                del g["global"]
            g.create_dataset("global", data=model)
            _fsync(f)
            f.close()
            signals.test_pause("model_write")
            os.replace(tmp, self.path)

    @classmethod
    @_held
    def reopen(cls, path, rounds_kept, **attrs):
        """An existing run.h5 continued by --resume: rows after the first `rounds_kept` dropped (the resumed
        run recomputes them), status back to running, `attrs` updated, the resume noted in `resumes`."""
        log = cls(path)
        log.truncate(rounds_kept)
        with h5py.File(path, "a") as f:
            history, previous = str(f.attrs.get("resumes", "")), str(f.attrs.get("status", ""))
            if int(f.attrs.get("nonfinite_round", 0)) > rounds_kept:     # that round is recomputed
                for key in ("nonfinite_round", "nonfinite"):
                    f.attrs.pop(key, None)
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        # A previous status `running` means that job was killed without a word (e.g. SIGKILL).
        entry = (f"{when} from round {rounds_kept} at world_size {attrs.get('world_size', '?')} "
                 f"(previous status {previous})")
        log.set_attrs(status="running", error="", error_detail="", resumes=(history + "\n" + entry).strip(), **attrs)
        return log

    @_held
    def truncate(self, rounds_kept):
        """Drops rows after the first `rounds_kept` (a resume recomputes them)."""
        self.close()
        ensure_room(self.path, 0, slack=ATTR_SLACK_BYTES)
        with write_errors.h5_file(self.path, self.path, "a") as f:
            for ds in (list(f["metrics"].values()) + list(f["clients"].values())
                       + list(f.get("timing", {}).values())):
                ds.resize((min(rounds_kept, ds.shape[0]),) + ds.shape[1:])

    @_held
    def adopt_rows(self, source, rounds):
        """Copies the first `rounds` rows of every /metrics, /clients and /timing dataset of run file `source`
        (a forked run's parent) into this freshly created log, so its curves start at round 0."""
        self.close()
        with open_run(source) as src:
            datasets = {f"{group}/{name}": ds for group in ("metrics", "clients", "timing") if group in src
                        for name, ds in src[group].items()}
            ensure_room(self.path, sum(ds.dtype.itemsize * int(np.prod(ds.shape[1:])) * rounds
                                        for ds in datasets.values()))
            with write_errors.h5_file(self.path, self.path, "a") as f:
                for path, ds in datasets.items():
                    rows = ds[:rounds]
                    if path in f:
                        del f[path]
                    growable = path.startswith("clients/") and src["clients"].attrs.get("layout") == ROWS
                    f.create_dataset(path, data=rows, maxshape=(None,) + ((None,) if growable else ds.shape[1:]),
                                     chunks=ds.chunks or True, fillvalue=ds.fillvalue)
                    for key, value in ds.attrs.items():
                        f[path].attrs[key] = value
                for key, value in src["clients"].attrs.items() if "clients" in src else ():
                    f["clients"].attrs[key] = value

    @_held
    def set_attrs(self, **attrs):
        """Root attributes, written in place after checking there is room for them (an attribute that grows
        on a full disk makes the file unreadable)."""
        self.close()
        ensure_room(self.path, sum(len(str(v)) for v in attrs.values()), slack=ATTR_SLACK_BYTES)
        with write_errors.h5_file(self.path, self.path, "a") as f:
            for k, v in attrs.items():
                f.attrs[k] = v
            f.attrs["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def finish(self, status, error=""):
        """The run's outcome (written into the room reserved for the last row if the disk is full now)."""
        self.set_attrs(status=status, error=error)


def read_clients(path, rows=None) -> dict:
    """{name: [round, client] float32} of the run file at `path`, either layout."""
    with open_run(path) as f:
        table = client_table(f, rows)
        return {name: table.dense(name) for name in table.names}


# One write's context: failures become WriteFailed naming the file (fedmpi.io.write_errors).
_writing = write_errors.writing


def _fsync(f):
    f.flush()
    try:
        os.fsync(f.id.get_vfd_handle())
    except (OSError, ValueError, TypeError):
        pass


def open_run(path):
    """Opens a run file read-only without taking HDF5's lock, retrying while the writer is mid-append; a path
    that is not a regular file (a FIFO named run.h5 would block the open) is InputError at once."""
    check_input(path, f"run file {path}")
    last = None
    for attempt in range(READ_RETRIES):
        try:
            return h5py.File(path, "r", locking=False)
        except OSError as e:
            last = e
            time.sleep(0.05 * (attempt + 1))
    raise last
