"""The HDF5 run log `OUT/run.h5` (DESIGN §3, contract); the only module that writes HDF5 run logs.

Per-client figures (issue 14) are stored as rows of the clients a round names, not as [round, client]
matrices: /clients/ids [round, width] int32 (-1 pads a short row) and /clients/<name> [round, width]
float32 beside it, where `width` grows to the longest row. A round names the clients where any figure
differs from its `fill` (0 for the indicators selected / dropped / late / arrived, NaN for the rest): the
selected ones, and e.g. FedBuff's arrivals. The group's attributes say `layout = "rows"` and
`num_clients`; each dataset's `fill` attribute is what a client left out of a row reads as. So the file
grows with the clients selected, not with N. `client_table` reads either this layout or the dense
[round, client] datasets of older files as the same [round, client] view; a resumed or forked old file
keeps its dense layout.

Written by rank 0 only. `append` keeps the file open from one round to the next (reopening it each round
cost ~1.5 ms, a tenth of a round of many tiny clients) and flushes it after every row; every other write
closes that handle and opens, writes and closes the file as before. So between rounds the file is
complete on disk: a running job's log can be read by `fedmpi report` or `tools/`, and a crashed job
leaves every finished round behind. The appending handle takes no HDF5 file lock and readers open with
locking off (`open_run`), so neither blocks the other; in the writing process itself, another handle
on the file during the run must also use locking=False (HDF5 refuses mixed flags).

A full disk must not cost the rounds already logged. HDF5 cannot survive a failed write: measured with
h5py 3.16 / HDF5 2.0, a flush that meets ENOSPC segfaults or leaves a file that no longer opens ("addr
overflow"), and so does growing an attribute on a full disk. So every write first reserves the room it
can need (`_ensure_room`): the largest amount it can add (a new chunk of every dataset it touches, the
model, the attributes) plus a slack for HDF5's metadata. The reservation is real where the file system
allows it: `fallocate(FALLOC_FL_KEEP_SIZE)` allocates the blocks past the end of the file without
changing its size, so a full disk, a quota (which statvfs cannot see) or another job filling the disk
makes the reservation fail, before anything is written, and never the write itself. Where the file
system cannot reserve (NFS v3, some Lustre and ZFS versions) the free space is checked with statvfs
instead, which a quota or a concurrent writer can still defeat. The file-size limit (RLIMIT_FSIZE) is
checked too. A refused write raises WriteFailed ("cannot write OUT/run.h5: No space left on device",
exit 1) and leaves the file as it was after the last complete round.

The blocks reserved for the last write stay reserved past the end of the file while the process runs,
so the final status (`failed`, and the error's detail) can still be written when something else, e.g. a
checkpoint, filled the disk; they are given back when the process exits. The final model goes into a
copy of the file that replaces it once complete: whatever goes wrong there, run.h5 is the old file or
the new one.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import os
import platform
import re
import resource
import shutil
import socket
import time
from datetime import datetime, timezone

import h5py
import numpy as np

import fedmpi
from fedmpi.core.errors import FedmpiError
from fedmpi.core.output_paths import temp_beside
from fedmpi.core.timing import PHASES
from fedmpi.mpi import signals

# The figures every run logs each round (NaN where not measured that round).
CORE_METRICS = ("round", "test_acc", "test_loss", "train_loss", "wall_s", "bytes_up", "bytes_down", "uploads")
READ_RETRIES = 5
METRIC_CHUNK, CLIENT_CHUNK = 256, 64     # rows per chunk of /metrics and /clients datasets
CLIENT_IDS, ROWS = "ids", "rows"          # /clients/ids and the /clients layout attribute of the rows layout
# Per-client figures that are 0, not NaN, for a client a round does not name.
ZERO_FILL = ("selected", "dropped", "late", "arrived")
# Room reserved beyond a write's own data for HDF5's metadata. Measured: appending a row to a run with
# 1,000 clients writes ~50 kB of metadata besides its chunks; attribute updates a few kB.
SLACK_BYTES = 1 << 20
ATTR_SLACK_BYTES = 64 << 10
FALLOC_FL_KEEP_SIZE = 0x01
CANNOT_RESERVE = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV)


class WriteFailed(FedmpiError):
    """run.h5 could not be written (no space, file too large, I/O error); the file keeps its last good state."""

    def __init__(self, path, reason):
        super().__init__(f"cannot write {path}: {reason}")
        self.path, self.reason = path, reason


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
        self._chunk_bytes = {}  # group -> bytes of one chunk of each of its datasets: what a new chunk row adds
        # Attributes of /metrics datasets, set when each is created (class_acc's class_counts, ...).
        self.metric_attrs = dict(metric_attrs or {})

    def _file(self):
        if self._f is None:
            with _writing(self.path):
                self._f = h5py.File(self.path, "a", locking=False)
            self._chunk_bytes = {group: sum(_chunk_bytes(ds) for ds in self._f.get(group, {}).values())
                                 for group in ("metrics", "clients", "timing")}
        return self._f

    def close(self):
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.close()
            except Exception as e:  # noqa: BLE001 - the final flush failed: see _abandon
                self._f = f
                self._abandon()
                raise WriteFailed(self.path, _reason(e)) from None

    def _abandon(self):
        """After a write that failed despite its reservation (an I/O error): close the handle at the lowest
        level, without the extra flush `File.close` would try. Best effort: HDF5 may not recover."""
        f, self._f = self._f, None
        if f is not None:
            try:
                f.id.close()
            except Exception:  # noqa: BLE001 - nothing more can be done for this handle
                pass

    @classmethod
    @_held
    def create(cls, path, cfg, world_size, hosts, partition_groups, extra_attrs=None):
        """Writes a fresh run.h5 (to a temporary name first, so a half-made file never has the real name)."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        need = sum(np.asarray(v).nbytes for datasets in partition_groups.values() for v in datasets.values())
        with _writing(path) as writing:
            # A unique new name (never a link planted at a fixed name such as run.h5.tmp), renamed into place.
            tmp = writing.discard = temp_beside(path)
            _ensure_room(path, need + len(cfg.to_yaml()) + len(CORE_METRICS) * METRIC_CHUNK * 8, tmp)
            cls._fill_new(tmp, cfg, world_size, hosts, partition_groups, extra_attrs)
            os.replace(tmp, path)
        return cls(path)

    @staticmethod
    def _fill_new(tmp, cfg, world_size, hosts, partition_groups, extra_attrs):
        """The fresh run file's attributes and groups, into the temporary file `tmp`."""
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

    @_held
    def append(self, metrics: dict, clients: dict | None = None, num_clients=None, timing=None):
        """One row: `metrics` maps name -> a float (missing core figures become NaN; new names get a column
        padded with NaN for earlier rounds), a string (/metrics/model_sha256) or a 1-D array (a row of a
        [round, k] figure such as class_acc); `clients` maps name -> [num_clients] array; `timing` is the
        round's [rank, phase] seconds (/timing/<phase> [round, rank])."""
        f = self._file()
        group = f["metrics"]
        n = group["round"].shape[0]
        new_metrics = {name: metrics[name] for name in set(metrics) - set(group)}
        dense = _dense_layout(f["clients"])
        if not dense:
            ids, clients = client_row(clients or {}, num_clients or 0)
        new_clients = [name for name in clients or {} if name not in f["clients"]]
        new_timing = timing is not None and "timing" not in f
        grown = {"metrics": sum(_new_metric_chunk(v) for v in new_metrics.values()),
                 "clients": len(new_clients) * CLIENT_CHUNK * (num_clients or 0) * 4 if dense else 0,
                 "timing": len(PHASES) * METRIC_CHUNK * 8 * timing.shape[0] if new_timing else 0}
        # Row n starts a new chunk of every dataset of a group when n is a multiple of its chunk rows; new
        # datasets start theirs now. Checked before anything changes: a refused row leaves no trace.
        _ensure_room(self.path, sum(grown.values()) +
                     (self._chunk_bytes["metrics"] + self._chunk_bytes["timing"] if n % METRIC_CHUNK == 0 else 0) +
                     ((self._chunk_bytes["clients"] if n % CLIENT_CHUNK == 0 else 0) if dense else
                      _rows_room(f["clients"], n, len(ids), len(new_clients))))
        for name, more in grown.items():
            self._chunk_bytes[name] += more
        try:
            for name, value in new_metrics.items():
                _metric_dataset(group, name, value, n, self.metric_attrs.get(name, {}))
            for name, ds in group.items():
                ds.resize((n + 1,) + ds.shape[1:])
                ds[n] = _cell(ds, metrics.get(name))
            if dense:
                _append_dense(f["clients"], n, clients or {}, num_clients)
            else:
                _append_rows(f["clients"], n, ids, clients, num_clients)
            if timing is not None:
                _append_timing(f.require_group("timing"), n, timing)
            f.flush()
        except Exception as e:  # noqa: BLE001 - h5py raises OSError, RuntimeError... for a failed write
            self._abandon()
            raise WriteFailed(self.path, _reason(e)) from None

    @_held
    def write_model(self, vec):
        """The newest global model as `/model/global` (float32), replaced each time it is written.

        Written into a copy of run.h5 that replaces it once complete (a model is written once or twice per
        run, at its end): whatever goes wrong, run.h5 is either the old file or the new one."""
        self.close()
        model = np.asarray(vec, dtype=np.float32)
        with _writing(self.path) as writing:
            tmp = writing.discard = temp_beside(self.path)      # unique, new: never a planted link
            _ensure_room(self.path, os.path.getsize(self.path) + model.nbytes, tmp)
            with open(self.path, "rb") as src, open(tmp, "r+b") as dst:    # r+b: no truncation of the reservation
                shutil.copyfileobj(src, dst, 1 << 20)
            with h5py.File(tmp, "a") as f:
                g = f.require_group("model")
                if "global" in g:
                    del g["global"]
                g.create_dataset("global", data=model)
                _fsync(f)
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
        _ensure_room(self.path, 0, slack=ATTR_SLACK_BYTES)
        with _writing(self.path), h5py.File(self.path, "a") as f:
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
            _ensure_room(self.path, sum(ds.dtype.itemsize * int(np.prod(ds.shape[1:])) * rounds
                                        for ds in datasets.values()))
            with _writing(self.path), h5py.File(self.path, "a") as f:
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
        _ensure_room(self.path, sum(len(str(v)) for v in attrs.values()), slack=ATTR_SLACK_BYTES)
        with _writing(self.path), h5py.File(self.path, "a") as f:
            for k, v in attrs.items():
                f.attrs[k] = v
            f.attrs["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def finish(self, status, error=""):
        """The run's outcome (written into the room reserved for the last row if the disk is full now)."""
        self.set_attrs(status=status, error=error)


def client_row(clients, num_clients):
    """(ids, {name: values at ids}) of a round's per-client figures (name -> [num_clients] rows): the clients
    where any figure differs from its fill, in increasing id. Nothing is lost: every other entry is its fill."""
    keep = np.zeros(num_clients, dtype=bool)
    rows = {name: np.asarray(row, dtype=np.float32) for name, row in clients.items()}
    for name, row in rows.items():
        keep |= ~np.isnan(row) if np.isnan(_fill(name)) else row != _fill(name)
    ids = np.flatnonzero(keep).astype(np.int32)
    return ids, {name: row[ids] for name, row in rows.items()}


def _fill(name):
    return 0.0 if name in ZERO_FILL else np.nan


def _dense_layout(group):
    """An older file's /clients: [round, client] datasets, no layout attribute (kept as it is when resumed)."""
    return group.attrs.get("layout") != ROWS and len(group) > 0


def _append_dense(group, n, clients, num_clients):
    for name, row in clients.items():
        ds = group.get(name)
        if ds is None:
            ds = group.create_dataset(name, shape=(n, num_clients), maxshape=(None, num_clients),
                                      dtype="f4", fillvalue=np.nan, chunks=(CLIENT_CHUNK, num_clients))
        ds.resize((n + 1, num_clients))
        ds[n] = row
    for ds in group.values():
        if ds.shape[0] < n + 1:
            ds.resize((n + 1, ds.shape[1]))


def _rows_room(group, n, count, new):
    """Bytes row n of the rows layout can add: a new chunk row of every dataset when it starts one (every
    CLIENT_CHUNK rows, or when this row of `count` clients widens the datasets), and one for each of the
    `new` datasets it creates (plus the ids on the first row)."""
    now = group[CLIENT_IDS].shape[1] if CLIENT_IDS in group else 0
    width = max(count, now, 1)
    chunk = group[CLIENT_IDS].chunks[1] if CLIENT_IDS in group else width
    per_dataset = CLIENT_CHUNK * 4 * -(-width // chunk) * chunk
    fresh = n % CLIENT_CHUNK == 0 or count > now
    return per_dataset * ((len(group) if fresh else 0) + new + (CLIENT_IDS not in group))


def _append_rows(group, n, ids, values, num_clients):
    """Row n of the rows layout: the ids, each figure at them, every other dataset's row at its fill. Whole
    rows are written (a resumed run re-writes rows whose old contents a truncation may have kept)."""
    if CLIENT_IDS not in group:
        if not values:          # no per-client figures yet: nothing to lay out
            return
        group.attrs["layout"], group.attrs["num_clients"] = ROWS, int(num_clients)
        width = max(len(ids), 1)
        group.create_dataset(CLIENT_IDS, shape=(n, width), maxshape=(None, None), dtype="i4", fillvalue=-1,
                             chunks=(CLIENT_CHUNK, width))
    width = max(group[CLIENT_IDS].shape[1], len(ids))
    for name in values:
        if name not in group:
            ds = group.create_dataset(name, shape=(n, width), maxshape=(None, None), dtype="f4", fillvalue=np.nan,
                                      chunks=(CLIENT_CHUNK, group[CLIENT_IDS].chunks[1]))
            ds.attrs["fill"] = _fill(name)
    for name, ds in group.items():
        ds.resize((n + 1, width))
        row = np.full(width, -1 if name == CLIENT_IDS else np.nan, dtype=ds.dtype)
        row[: len(ids)] = ids if name == CLIENT_IDS else values.get(name, ds.attrs.get("fill", np.nan))
        ds[n] = row


class ClientTable:
    """/clients of an open run file as [round, client] rows, from the rows layout or an older file's dense
    datasets alike: `names`, `table[name]` (a [round, client] view made row by row: `len`, `[i]`, `dense()`)."""

    def __init__(self, group, rows=None):
        self.rows = {}
        if group is None:
            self.num_clients, self.names = 0, []
            return
        if group.attrs.get("layout") == ROWS:
            self.num_clients = int(group.attrs["num_clients"])
            self.ids = group[CLIENT_IDS][:rows]
            self.fills = {n: float(ds.attrs.get("fill", np.nan)) for n, ds in group.items() if n != CLIENT_IDS}
            self.rows = {n: group[n][:rows] for n in self.fills}
            self.dense_data = None
        else:
            self.dense_data = {n: ds[:rows] for n, ds in group.items()
                               if isinstance(ds, h5py.Dataset) and ds.ndim == 2 and ds.dtype.kind in "biuf"}
            self.num_clients = max((d.shape[1] for d in self.dense_data.values()), default=0)
        self.names = sorted(self.dense_data if self.dense_data is not None else self.rows)

    def __contains__(self, name):
        return name in self.names

    def __getitem__(self, name):
        if name not in self.names:
            raise KeyError(name)
        return _ClientRows(self, name)

    def row(self, name, i):
        """Round i's [client] values of figure `name`."""
        if self.dense_data is not None:
            return self.dense_data[name][i]
        out = np.full(self.num_clients, self.fills[name], dtype=np.float32)
        ids = self.ids[i]
        named = ids >= 0
        out[ids[named]] = self.rows[name][i][named]
        return out

    def length(self, name):
        return len(self.dense_data[name] if self.dense_data is not None else self.ids)

    def dense(self, name):
        """The whole [round, client] array of figure `name`."""
        if self.dense_data is not None:
            return self.dense_data[name]
        out = np.full((len(self.ids), self.num_clients), self.fills[name], dtype=np.float32)
        r, c = np.nonzero(self.ids >= 0)
        out[r, self.ids[r, c]] = self.rows[name][r, c]
        return out


class _ClientRows:
    def __init__(self, table, name):
        self.table, self.name = table, name

    def __len__(self):
        return self.table.length(self.name)

    def __getitem__(self, i):
        return self.table.row(self.name, i)

    def dense(self):
        return self.table.dense(self.name)


def client_table(f, rows=None) -> ClientTable:
    """The per-client figures of open run file `f` (its first `rows` rounds), either layout (see above)."""
    return ClientTable(f.get("clients"), rows)


def read_clients(path, rows=None) -> dict:
    """{name: [round, client] float32} of the run file at `path`, either layout."""
    with open_run(path) as f:
        table = client_table(f, rows)
        return {name: table.dense(name) for name in table.names}


def _new_metric_chunk(value):
    """Bytes of the first chunk of a new /metrics dataset for `value` (see _metric_dataset)."""
    if isinstance(value, (str, bytes)):
        return METRIC_CHUNK * 64
    return METRIC_CHUNK * 8 * (len(value) if np.ndim(value) == 1 else 1)


def _metric_dataset(group, name, value, length, attrs):
    """A growable /metrics dataset shaped for `value`: text (S64), a [round, k] row, or one float per round."""
    if isinstance(value, (str, bytes)):
        ds = group.create_dataset(name, shape=(length,), maxshape=(None,), dtype="S64", chunks=(METRIC_CHUNK,),
                                  fillvalue=b"")
    elif np.ndim(value) == 1:
        k = len(value)
        ds = group.create_dataset(name, shape=(length, k), maxshape=(None, k), dtype="f8", chunks=(METRIC_CHUNK, k),
                                  fillvalue=np.nan)
    else:
        ds = _growable(group, name, length)
    for key, v in attrs.items():
        ds.attrs[key] = v
    return ds


def _append_timing(group, n, timing):
    """Row n of /timing/<phase> [round, rank] (NaN where a resumed run has another number of ranks)."""
    for i, phase in enumerate(PHASES):
        ds = group.get(phase)
        if ds is None:
            ds = group.create_dataset(phase, shape=(n, timing.shape[0]), maxshape=(None, timing.shape[0]),
                                      dtype="f8", fillvalue=np.nan, chunks=(METRIC_CHUNK, timing.shape[0]))
        ds.resize((n + 1, ds.shape[1]))
        ds[n] = timing[:, i] if timing.shape[0] == ds.shape[1] else np.nan


def _cell(ds, value):
    """What a row of `ds` holds for `value` (None: not measured this round)."""
    if ds.dtype.kind == "S":
        return (value or "").encode() if isinstance(value, str) else (value or b"")
    if value is None:
        return np.full(ds.shape[1:], np.nan) if ds.ndim > 1 else np.nan
    return value


def _growable(group, name, length=0):
    return group.create_dataset(name, shape=(length,), maxshape=(None,), dtype="f8", chunks=(METRIC_CHUNK,),
                                fillvalue=np.nan)


def _chunk_bytes(ds):
    return int(np.prod(ds.chunks)) * ds.dtype.itemsize if ds.chunks else 0


def _ensure_room(path, nbytes, written=None, slack=SLACK_BYTES):
    """Reserves room for `written` (default `path`) to grow by `nbytes` + `slack`, or raises WriteFailed:
    blocks allocated past its end where the file system can (see the module docstring), else enough free
    space for this user (statvfs); and below the process's file-size limit either way."""
    written = written or path
    need = nbytes + slack
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        size = os.path.getsize(written) if os.path.exists(written) else 0
        if size + need > limit:
            raise WriteFailed(path, os.strerror(errno.EFBIG))
    try:
        if os.path.exists(written) and _reserve(written, need):
            return
        st = os.statvfs(os.path.dirname(os.path.abspath(written)))
    except OSError as e:
        raise WriteFailed(path, e.strerror or str(e)) from None
    if st.f_bavail * st.f_frsize < need:
        raise WriteFailed(path, os.strerror(errno.ENOSPC))


def _libc_fallocate():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_FALLOCATE = _libc_fallocate()
_RESERVED = set()       # files holding blocks past their end, given back at exit


def _reserve(path, nbytes):
    """Allocates `nbytes` past the end of `path` without changing its size. False where the file system (or
    the platform) cannot; OSError (ENOSPC, EDQUOT, ...) where there is no room."""
    if _FALLOCATE is None:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if _FALLOCATE(fd, FALLOC_FL_KEEP_SIZE, os.fstat(fd).st_size, nbytes) == 0:
            if not _RESERVED:
                atexit.register(_release_all)
            _RESERVED.add(os.path.abspath(path))
            return True
        code = ctypes.get_errno()
    finally:
        os.close(fd)
    if code in CANNOT_RESERVE:
        return False
    raise OSError(code, os.strerror(code))


def _release_all():
    """Gives back the blocks reserved past the end of each file (truncating a file to its own size frees them).
    A process ended by MPI_Abort or os._exit skips this; its file keeps at most one write's reservation."""
    for path in _RESERVED:
        try:
            os.truncate(path, os.path.getsize(path))
        except OSError:
            pass


class _writing:
    """Context for one write to `path`: any failure becomes WriteFailed naming `path` with the system's
    reason, and the temporary file `discard` (if any) is removed."""

    def __init__(self, path, discard=None):
        self.path, self.discard = path, discard

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None:
            return False
        if self.discard:
            try:
                os.remove(self.discard)
            except OSError:
                pass
        if isinstance(error, WriteFailed) or not isinstance(error, Exception):
            return False
        raise WriteFailed(self.path, _reason(error)) from None


def _reason(error):
    """The system's words for a failed write ('No space left on device'), from an OSError or from the errno
    HDF5 quotes in its message; else the message's first line."""
    code = getattr(error, "errno", None)
    if not code:
        m = re.search(r"errno = (\d+)", str(error))
        code = int(m.group(1)) if m else None
    if code:
        return os.strerror(code)
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


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
