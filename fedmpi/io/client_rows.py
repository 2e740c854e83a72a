"""The run log's per-client figures (/clients): a round's row of the clients it names, written in the rows
layout or appended to an older file's dense [round, client] datasets, and read back as one [round, client]
view of either layout (`ClientTable`). See fedmpi.io.store's docstring for the layout."""

from __future__ import annotations

import h5py
import numpy as np

CLIENT_CHUNK = 64     # rows per chunk of /clients datasets
CLIENT_IDS, ROWS = "ids", "rows"          # /clients/ids and the /clients layout attribute of the rows layout
# Per-client figures that are 0, not NaN, for a client a round does not name.
ZERO_FILL = ("selected", "dropped", "late", "arrived")


def client_row(clients, num_clients):
    """(ids, {name: values at ids}) of a round's per-client figures (name -> [num_clients] rows): the clients
    where any figure differs from its fill, in increasing id. Nothing is lost: every other entry is its fill."""
    keep = np.zeros(num_clients, dtype=bool)
    rows = {name: np.asarray(row, dtype=np.float32) for name, row in clients.items()}
    for name, row in rows.items():
        keep |= ~np.isnan(row) if np.isnan(fill_of(name)) else row != fill_of(name)
    ids = np.flatnonzero(keep).astype(np.int32)
    return ids, {name: row[ids] for name, row in rows.items()}


def fill_of(name):
    return 0.0 if name in ZERO_FILL else np.nan


def dense_layout(group):
    """An older file's /clients: [round, client] datasets, no layout attribute (kept as it is when resumed)."""
    return group.attrs.get("layout") != ROWS and len(group) > 0


def append_dense(group, n, clients, num_clients):
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


def rows_room(group, n, count, new):
    """Bytes row n of the rows layout can add: a new chunk row of every dataset when it starts one (every
    CLIENT_CHUNK rows, or when this row of `count` clients widens the datasets), and one for each of the
    `new` datasets it creates (plus the ids on the first row)."""
    now = group[CLIENT_IDS].shape[1] if CLIENT_IDS in group else 0
    width = max(count, now, 1)
    chunk = group[CLIENT_IDS].chunks[1] if CLIENT_IDS in group else width
    per_dataset = CLIENT_CHUNK * 4 * -(-width // chunk) * chunk
    fresh = n % CLIENT_CHUNK == 0 or count > now
    return per_dataset * ((len(group) if fresh else 0) + new + (CLIENT_IDS not in group))


def append_rows(group, n, ids, values, num_clients):
    """Rows n.. of the rows layout, one per entry of `ids` (each round's client ids) and `values` (each
    round's {figure: values at its ids}): the ids, each figure at them, every other dataset's row at its
    fill. Whole rows are written (a resumed run re-writes rows whose old contents a truncation may have
    kept); every dataset is resized and written once."""
    if CLIENT_IDS not in group:
        if not any(values):          # no per-client figures yet: nothing to lay out
            return
        group.attrs["layout"], group.attrs["num_clients"] = ROWS, int(num_clients)
        width = max(max(len(i) for i in ids), 1)
        group.create_dataset(CLIENT_IDS, shape=(n, width), maxshape=(None, None), dtype="i4", fillvalue=-1,
                             chunks=(CLIENT_CHUNK, width))
    width = max(group[CLIENT_IDS].shape[1], max(len(i) for i in ids))
    for name in dict.fromkeys(name for row in values for name in row):
        if name not in group:
            ds = group.create_dataset(name, shape=(n, width), maxshape=(None, None), dtype="f4", fillvalue=np.nan,
                                      chunks=(CLIENT_CHUNK, group[CLIENT_IDS].chunks[1]))
            ds.attrs["fill"] = fill_of(name)
    for name, ds in group.items():
        ds.resize((n + len(ids), width))
        block = np.full((len(ids), width), -1 if name == CLIENT_IDS else np.nan, dtype=ds.dtype)
        for j, (row_ids, row) in enumerate(zip(ids, values)):
            block[j, : len(row_ids)] = row_ids if name == CLIENT_IDS else row.get(name, ds.attrs.get("fill", np.nan))
        ds[n:] = block


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
