"""Reading a run's recorded client updates (`checkpoint.updates: true`, written by fedmpi.uploads.record):
OUT/updates/rank-<R>.h5, one file per rank that hosted clients, merged into one record per round. Which rank
hosted a client depends on -n; the merged record does not.

  read_updates(out)    {round: RoundUpdates(start, deltas {cid: delta}, weights {cid: weight})}: everything,
                       in memory (rounds x clients x model size x 4 bytes)
  update_norms(out)    {round: {cid: the delta's norm}}: attributes only, for readers that need no vectors

A folder that is missing, holds no rank file, or a file that cannot be read as a recording: InputError
naming it. A client found in two files of a round (a resume at another -n leaves the earlier files) takes
the value of the lower rank's file; both hold the same numbers, since every rank recomputes a round alike.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from fedmpi.core.errors import InputError
from fedmpi.uploads.record import FOLDER

RANK_FILE = re.compile(r"^rank-(\d+)\.h5$")
ROUND_GROUP = re.compile(r"^round_(\d+)$")
CLIENT_DATA = re.compile(r"^client_(\d+)$")


@dataclass
class RoundUpdates:
    """One round's recorded updates: the start vector the clients trained from, each counted client's delta
    (float32, trained model - start) and its weight in the average."""

    start: np.ndarray
    deltas: dict[int, np.ndarray] = field(default_factory=dict)
    weights: dict[int, float] = field(default_factory=dict)


def rank_files(out) -> list:
    """The recording's files of run folder `out`, by rank; InputError where there are none."""
    folder = os.path.join(out, FOLDER)
    if not os.path.isdir(folder):
        raise InputError(f"{folder}: no recorded client updates there (run the original with "
                         f"checkpoint.updates: true)")
    found = sorted((int(m.group(1)), name) for name in os.listdir(folder) if (m := RANK_FILE.match(name)))
    if not found:
        raise InputError(f"{folder}: holds no rank-<R>.h5 file of recorded client updates (run the original "
                         f"with checkpoint.updates: true)")
    return [os.path.join(folder, name) for _, name in found]


def _walk(out, visit):
    """Calls visit(round, group, cid, dataset) for every recorded update (lower ranks first), and
    visit(round, group, None, None) once per file and round; InputError for a file that is no recording."""
    import h5py

    for path in rank_files(out):
        try:
            with h5py.File(path, "r", locking=False) as f:
                for name, group in f.items():
                    m = ROUND_GROUP.match(name)
                    if m is None or not isinstance(group, h5py.Group) or "start" not in group:
                        raise InputError(f"{path}: {name!r} is not a recorded round (round_<t> with a start)")
                    t = int(m.group(1))
                    visit(t, group, None, None)
                    for key, data in group.items():
                        c = CLIENT_DATA.match(key)
                        if c is not None:
                            visit(t, group, int(c.group(1)), data)
        except InputError:
            raise
        except (OSError, KeyError, ValueError) as e:
            raise InputError(f"{path}: cannot be read as recorded client updates ({e})") from None


def read_updates(out) -> dict[int, RoundUpdates]:
    """Every recorded update of run folder `out`, merged over its rank files: {round: RoundUpdates}."""
    rounds: dict[int, RoundUpdates] = {}

    def visit(t, group, cid, data):
        if cid is None:
            if t not in rounds:
                rounds[t] = RoundUpdates(np.asarray(group["start"][()], dtype=np.float32))
            return
        record = rounds[t]
        if cid not in record.deltas:
            record.deltas[cid] = np.asarray(data[()], dtype=np.float32)
            record.weights[cid] = float(data.attrs["weight"])

    _walk(out, visit)
    return dict(sorted(rounds.items()))


def update_norms(out) -> dict[int, dict[int, float]]:
    """{round: {cid: the Euclidean norm of its recorded delta}} of run folder `out`, from the attributes alone."""
    norms: dict[int, dict[int, float]] = {}

    def visit(t, group, cid, data):
        norms.setdefault(t, {})
        if cid is not None and cid not in norms[t]:
            norms[t][cid] = float(data.attrs["norm"])

    _walk(out, visit)
    return dict(sorted(norms.items()))
