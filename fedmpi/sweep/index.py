"""The sweep's index, OUT/index.csv: one row per experiment of the spec, in the spec's order, rewritten whole
(to a temporary file, fsynced, then renamed over the old one) by rank 0 at every change, so that it is true
at every moment a reader or a killed job may see it.

Columns: name, status (pending, running, finished, failed, diverged, refused, preempted, interrupted), folder,
ranks, seed, overrides (the experiment's dotted keys as JSON, its seed and out included), attempts (starts
in this and earlier launches), started and ended (UTC, the first start and the latest end), wall_s (seconds
over every attempt), exit_code (of the latest attempt) and message (why it failed, or what a new start did).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass, fields

from fedmpi.core.errors import InputError
from fedmpi.core.input_files import read_input
from fedmpi.core.output_paths import check_regular, replace_with

INDEX_NAME = "index.csv"
STATUSES = ("pending", "running", "finished", "failed", "diverged", "refused", "preempted", "interrupted")
UNFINISHED = ("pending", "running", "preempted", "interrupted")     # what a new start continues


@dataclass
class Row:
    name: str
    status: str = "pending"
    folder: str = ""
    ranks: int = 1
    seed: int = 0
    overrides: str = "{}"
    attempts: int = 0
    started: str = ""
    ended: str = ""
    wall_s: float = 0.0
    exit_code: str = ""
    message: str = ""


COLUMNS = tuple(f.name for f in fields(Row))


def path_of(sweep_out):
    return os.path.join(sweep_out, INDEX_NAME)


def new_row(exp, cfg, ranks) -> Row:
    return Row(exp.name, folder=cfg.out, ranks=ranks, seed=cfg.seed,
               overrides=json.dumps({**exp.overrides, "out": cfg.out}, default=str))


def place_problem(sweep_out) -> str:
    """Why OUT/index.csv cannot be (re)written, or "": it is a folder, or a device node, FIFO or socket (or a
    link to one), which the rename of `write` would replace. Checked before the index is read."""
    path = path_of(sweep_out)
    if os.path.isdir(path):
        return f"{path} is a folder; the sweep writes its index there (move it away, or change the spec's out)"
    try:
        check_regular(path, "the sweep's index")
    except InputError as e:
        return str(e)
    return ""


def read(sweep_out) -> dict:
    """{name: Row} of an existing index (an unreadable or absent one: {}; it is rewritten from the folders)."""
    try:
        found = read_input(path_of(sweep_out), f"the sweep's index {path_of(sweep_out)}").decode("utf-8")
        rows = list(csv.DictReader(io.StringIO(found, newline="")))
    except (OSError, UnicodeDecodeError, csv.Error):
        return {}
    out = {}
    for raw in rows:
        try:
            row = Row(**{k: raw.get(k) or "" for k in COLUMNS})
            row.ranks, row.seed, row.attempts = int(row.ranks or 1), int(row.seed or 0), int(row.attempts or 0)
            row.wall_s = float(row.wall_s or 0.0)
        except (TypeError, ValueError):
            continue
        out[row.name] = row
    return out


def text(rows) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        values = asdict(row)
        values["wall_s"] = f"{row.wall_s:.3f}"
        values["message"] = " ".join(str(row.message).split())[:500]
        writer.writerow(values)
    return buf.getvalue()


def write(sweep_out, rows):
    """Replaces OUT/index.csv by `rows` at once (see the module docstring)."""
    data = text(rows)

    def fill(fh):
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())

    replace_with(path_of(sweep_out), fill, newline="", encoding="utf-8")
