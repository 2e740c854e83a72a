"""Reading the deployment trace files: per-device on/off intervals and per-device rates.

Format (all traces): CSV text. Blank lines and lines starting with `#` are ignored; the first other line
is the header, exactly the columns named below in that order; every further line is one row. Devices
are numbered 0..M-1 by the `client` column (M = largest id + 1); client i of a run follows device
i mod M, so a trace of a few hundred measured devices can drive thousands of clients (FedScale maps its
device traces to clients the same way).

- availability, `client,start,end`: device `client` is on during [start, end) simulated seconds; any
  number of rows per device, `end` may be `inf`; a device with no row is never on.
- speed, `client,steps_per_s`: exactly one row per device 0..M-1.
- bandwidth, `client,up_bytes_per_s,down_bytes_per_s`: exactly one row per device 0..M-1.

Device ids are bounded before anything is allocated by them: below max(clients, R), `clients` the run's
number of clients (partition.clients) and R the file's rows. A trace may describe more devices than a run
uses, but a 40-byte file naming device 10^9 (which used to hang set-up for minutes, or take 15 GB for a
speed trace) is refused with the valid range. Rates lie in the range the config keys allow (deploy.keys).

Every problem is an InputError naming the file and line. Reading parses numbers only; nothing runs.
"""

import math
from dataclasses import dataclass

import numpy as np

from fedmpi.core.errors import InputError
from fedmpi.core.input_files import read_input
from fedmpi.deploy.keys import MAX_RATE, MIN_RATE

AVAILABILITY_COLUMNS = ("client", "start", "end")
SPEED_COLUMNS = ("client", "steps_per_s")
BANDWIDTH_COLUMNS = ("client", "up_bytes_per_s", "down_bytes_per_s")
TRACE_KEYS = {AVAILABILITY_COLUMNS: "clients.trace", SPEED_COLUMNS: "clients.speed.trace",
              BANDWIDTH_COLUMNS: "clients.bandwidth.trace"}     # the config key naming each kind's file


def read_rows(path, columns):
    """[(line number, [cell, ...])] of a trace file after its header; checks the header and widths."""
    try:
        lines = read_input(path, f"{TRACE_KEYS.get(columns, 'trace file')} = {path!r}").decode("utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"trace file {path!r} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"trace file {path!r} cannot be read: {e}") from None
    rows, header = [], None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        cells = [cell.strip() for cell in text.split(",")]
        if header is None:
            header = cells
            if tuple(cells) != columns:
                raise InputError(f"{path}, line {number}: header {text!r}; expected {','.join(columns)}")
            continue
        if len(cells) != len(columns):
            raise InputError(f"{path}, line {number}: {len(cells)} values; expected {len(columns)} "
                             f"({','.join(columns)})")
        rows.append((number, cells))
    if header is None or not rows:
        raise InputError(f"trace file {path!r} has no rows; expected the header {','.join(columns)} and "
                         "at least one row")
    return rows


def device_bound(rows, clients):
    """How many device ids a trace of `rows` rows may use in a run of `clients` clients (None: any)."""
    return None if clients is None else max(int(clients), len(rows))


def _device(path, number, cell, bound=None):
    try:
        value = int(cell)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"{path}, line {number}: client {cell[:40]!r} must be an integer >= 0")
    if bound is not None and value >= bound:
        raise InputError(f"{path}, line {number}: client {cell[:40]} is out of range: device ids lie in "
                         f"0..{bound - 1} (the run's partition.clients, or the file's number of rows if larger)")
    return value


def _seconds(path, number, name, cell, allow_inf=False):
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        allowed = "a number >= 0 or inf" if allow_inf else "a finite number >= 0"
        raise InputError(f"{path}, line {number}: {name} {cell!r} must be {allowed}")
    return value


def _rate(path, number, name, cell):
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{path}, line {number}: {name} {cell!r} must be a finite number > 0")
    if not MIN_RATE <= value <= MAX_RATE:
        raise InputError(f"{path}, line {number}: {name} {cell!r} must lie in [{MIN_RATE:g}, {MAX_RATE:g}] "
                         f"per second (simulated times must stay finite)")
    return value


@dataclass(frozen=True)
class AvailabilityTrace:
    """On-intervals per device; `period` (or None) makes the trace repeat."""

    intervals: tuple            # intervals[device] = ((start, end), ...) sorted by start
    period: float | None = None

    @classmethod
    def load(cls, path, period=None, clients=None):
        """`clients`: the run's number of clients, which bounds the device ids (module docstring)."""
        per_device = {}
        rows = read_rows(path, AVAILABILITY_COLUMNS)
        bound = device_bound(rows, clients)
        for number, (client, start, end) in rows:
            device = _device(path, number, client, bound)
            lo = _seconds(path, number, "start", start)
            hi = _seconds(path, number, "end", end, allow_inf=True)
            if not hi > lo:
                raise InputError(f"{path}, line {number}: end {end!r} must be greater than start {start!r}")
            if period is not None and hi > period:
                raise InputError(f"{path}, line {number}: end {end!r} lies beyond clients.trace_period "
                                 f"({period}); a repeating trace lists intervals inside [0, period]")
            per_device.setdefault(device, []).append((lo, hi))
        size = max(per_device) + 1
        return cls(tuple(tuple(sorted(per_device.get(d, ()))) for d in range(size)), period)

    def device_of(self, cid):
        return cid % len(self.intervals)

    def is_on(self, cid, sim_time):
        t = sim_time % self.period if self.period else sim_time
        return any(lo <= t < hi for lo, hi in self.intervals[self.device_of(cid)])

    def mask(self, sim_time, num_clients):
        return np.fromiter((self.is_on(c, sim_time) for c in range(num_clients)), dtype=bool, count=num_clients)

    def next_on(self, sim_time, num_clients):
        """The earliest time >= sim_time at which one of the clients is on (inf if none ever is again)."""
        devices = {self.device_of(c) for c in range(num_clients)}
        t = sim_time % self.period if self.period else sim_time
        best = math.inf
        for d in devices:
            for lo, hi in self.intervals[d]:
                if lo <= t < hi:
                    return sim_time
                if lo > t:
                    best = min(best, lo - t)
                elif self.period:       # already passed in this period: comes back in the next one
                    best = min(best, self.period - t + lo)
        return sim_time + best


def load_rates(path, columns, clients=None):
    """Per-device rates from a speed or bandwidth trace: an array [devices, len(columns) - 1]; `clients` (the
    run's number of clients) bounds the device ids as they are read."""
    by_device = {}
    rows = read_rows(path, columns)
    bound = device_bound(rows, clients)
    for number, cells in rows:
        device = _device(path, number, cells[0], bound)
        if device in by_device:
            raise InputError(f"{path}, line {number}: client {device} is listed twice (first on line "
                             f"{by_device[device][0]}); list each device once")
        by_device[device] = (number, [_rate(path, number, name, cell) for name, cell in zip(columns[1:], cells[1:])])
    ids = sorted(by_device)
    size = ids[-1] + 1
    if size != len(ids):        # found from the ids listed, without a list as long as the largest one
        first = next(i for i, d in enumerate(ids) if i != d)
        raise InputError(f"trace file {path!r}: no row for client {first} ({size - len(ids)} missing); "
                         f"list every device 0..{size - 1} once, since client i follows device i mod {size}")
    return np.array([by_device[d][1] for d in range(size)], dtype=np.float64)


def check_trace_files(clients):
    """Reads the header and rows of every trace file a ClientsConfig names (what `fedmpi run --dry-run` checks:
    each a regular file, read up to its size, with its columns); InputError naming the file and key."""
    named = ((clients.availability == "trace", clients.trace, AVAILABILITY_COLUMNS),
             (clients.speed.kind == "trace", clients.speed.trace, SPEED_COLUMNS),
             (clients.bandwidth.kind == "trace", clients.bandwidth.trace, BANDWIDTH_COLUMNS))
    for used, path, columns in named:
        if used and path:
            read_rows(path, columns)
