"""`fedmpi export RUN --tensorboard DIR` and `--csv FILE`: a run's figures for other tools (HDF5 stays the
record; an export can be made again at any time, also from a running job's file).

What goes out, under the same names in both:
- every per-round figure under /metrics by its name (`test_acc`, `weight_divergence`, an attack's
  `backdoor_acc`, the robust aggregators' `detect_precision`, `detect_recall`, `honest_excluded`, ...), its
  1-based round as the step and in the CSV's `round` column (the first round is 1, as on the console and in
  `fedmpi report`; /metrics/round on disk stores 0 for it); a [round, k] figure as NAME/LABEL per column
  (`class_acc/3`, the layer names of `weight_divergence_layers`);
- the phase times `/timing/<phase>` [round, rank] as `timing/PHASE/rankR`;
- TensorBoard only: each per-client figure `/clients/<name>` [round, client] as a histogram per round
  (`clients/NAME`) over the clients measured that round.
Rounds where a figure was not measured (NaN) are left out of TensorBoard and empty in the CSV.
TensorBoard's own event writer and protocol buffers are used (the `tensorboard` package, an optional
extra: pip install 'fedmpi[tensorboard]'); torch is not imported.
"""

from __future__ import annotations

import csv
import glob
import os
import sys
import time
from datetime import datetime

import h5py
import numpy as np

from fedmpi.analysis import report
from fedmpi.core.errors import FedmpiError, InputError
from fedmpi.core.output_paths import check_distinct, check_file, check_folder, check_regular, make_folders, replace_with
from fedmpi.io import series as series_names
from fedmpi.io.client_rows import CLIENT_IDS, client_table
from fedmpi.io.event_files import EventFile
from fedmpi.io.series import histogram
from fedmpi.io.store import open_run

EVENT_FILES = "events.out.tfevents.*"


# --- what a run holds, as named series --------------------------------------------------------------------

def column_labels(run, name, columns):
    """Labels of the columns of a [round, k] figure (fedmpi.io.series.column_labels on its attributes)."""
    return series_names.column_labels(run.metric_attrs.get(name, {}), columns)


def scalar_series(run):
    """[(tag, [row] values)] of every per-round number, in fedmpi.io.series' order and with its tags (the
    live trackers use the same): the core figures, the other 1-D figures by name, the [round, k] figures
    per column, the phase times per rank."""
    m = run.metrics
    numbers = [k for k in m if k not in report.TEXT_METRICS]
    one_d, two_d = series_names.ordered_names(numbers, lambda k: np.ndim(m[k]))
    series = [(k, np.asarray(m[k], dtype=np.float64)) for k in one_d]
    for name in two_d:
        values = np.asarray(m[name], dtype=np.float64)
        labels = column_labels(run, name, values.shape[1])
        series += [(series_names.column_tag(name, label), values[:, j]) for j, label in enumerate(labels)]
    for phase in sorted(run.timing):
        values = np.asarray(run.timing[phase], dtype=np.float64)
        series += [(series_names.timing_tag(phase, r), values[:, r]) for r in range(values.shape[1])]
    return series


def read_clients(path, rows, notes):
    """{name: [round, client] rows} of /clients (either layout, `store.client_table`: row i made when asked
    for), cut to the run's complete rows; a dataset that is not a [round, client] array of numbers is noted."""
    with open_run(path) as f:
        group = f.get("clients")
        if not isinstance(group, h5py.Group):
            return {}
        table = client_table(f, rows)
        for name in group:
            if name not in table and name != CLIENT_IDS:
                notes.append(f"/clients/{name} left out: not a [round, client] array of numbers")
    return {name: table[name] for name in table.names}


def _wall_times(run):
    """Each row's wall-clock time: the run's start plus its wall_s (TensorBoard's relative time axis then
    shows training time); now where the run does not say."""
    try:
        started = datetime.fromisoformat(str(run.attrs["started"])).timestamp()
    except (KeyError, ValueError):
        started = time.time()
    wall = np.asarray(run.metrics.get("wall_s", np.zeros(len(run.metrics["round"]))), dtype=np.float64)
    return started + np.nan_to_num(wall)


# --- TensorBoard ------------------------------------------------------------------------------------------

def _tensorboard():
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
        from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: F401 - what EventFile writes with
    except ImportError:
        raise InputError("--tensorboard needs the tensorboard package: pip install 'fedmpi[tensorboard]' "
                         "(or pip install tensorboard)") from None
    return Event, HistogramProto, Summary


def check_event_folder(folder, overwrite):
    """The folder for one run's event files under the place rule (fedmpi.core.output_paths): earlier event
    files there are refused (TensorBoard would show both exports mixed) unless `overwrite`; returns them
    (removed by `clear_event_files` once every other check has passed)."""
    check_folder(folder, "--tensorboard")
    old = sorted(glob.glob(os.path.join(glob.escape(folder), EVENT_FILES)))
    for path in old:
        check_regular(path, "--tensorboard")        # --overwrite removes only event files, never a node
    if old and not overwrite:
        raise InputError(f"--tensorboard {folder}: already holds {len(old)} TensorBoard event file(s) (an earlier "
                         f"export?); choose another folder, or replace them with --overwrite")
    return old


def clear_event_files(folder, old):
    """Makes `folder` (as mkdir -p) and removes the earlier event files found by `check_event_folder`."""
    make_folders(folder)
    for path in old:
        os.remove(path)


def write_tensorboard(run, clients, folder):
    """Writes the event file; returns (scalar points, histograms) written."""
    Event, HistogramProto, Summary = _tensorboard()
    steps = np.asarray(run.metrics["round"], dtype=np.float64) + 1       # 1-based, as a person reads rounds
    walls = _wall_times(run)
    series = scalar_series(run)
    writer = EventFile(folder)      # synchronous: a full disk is an OSError here, not a thread's traceback
    points = hists = 0
    try:
        for i, step in enumerate(steps):
            if not np.isfinite(step):
                continue
            values = [Summary.Value(tag=tag, simple_value=float(v[i]))
                      for tag, v in series if i < len(v) and np.isfinite(v[i])]
            for name, table in sorted(clients.items()):
                row = table[i] if i < len(table) else np.zeros(0)
                row = row[np.isfinite(row)]
                if len(row):
                    lo, hi, num, total, squares, limits, counts = histogram(row)
                    values.append(Summary.Value(tag=series_names.client_tag(name), histo=HistogramProto(
                        min=lo, max=hi, num=num, sum=total, sum_squares=squares, bucket_limit=limits, bucket=counts)))
                    hists += 1
            points += sum(1 for v in values if not v.HasField("histo"))
            if values:
                writer.write(Event(wall_time=float(walls[i]), step=int(step), summary=Summary(value=values)))
    except BaseException:
        writer.discard()
        raise
    writer.close()
    return points, hists


# --- CSV --------------------------------------------------------------------------------------------------

def _cell(value):
    if isinstance(value, bytes):
        return value.decode("ascii", errors="replace")
    value = float(value)
    return "" if np.isnan(value) else repr(value)


def write_csv(run, path):
    """One row per round: `round` (1-based), every per-round figure (NAME/LABEL columns for [round, k] ones, the
    fingerprint as text), the phase times per rank. Returns the number of rows."""
    series = scalar_series(run)
    text = [(k, run.metrics[k]) for k in report.TEXT_METRICS if k in run.metrics]
    rounds = np.asarray(run.metrics["round"], dtype=np.float64) + 1      # 1-based, as a person reads rounds

    def write(fh):
        writer = csv.writer(fh)
        writer.writerow(["round"] + [tag for tag, _ in series] + [k for k, _ in text])
        for i, r in enumerate(rounds):
            writer.writerow([_cell(r) if not float(r).is_integer() else str(int(r))]
                            + [_cell(v[i]) if i < len(v) else "" for _, v in series]
                            + [_cell(v[i]) for _, v in text])

    # A temporary file renamed into place: a link at `path` is replaced, never written through.
    replace_with(path, write, newline="")
    return len(rounds)


# --- the command ------------------------------------------------------------------------------------------

def export_command(path, tensorboard=None, csv_path=None, overwrite=False, out=None, err=None, force=False) -> int:
    """Exports the run at `path` (a run.h5 or its folder); InputError (exit 2) for bad inputs or places.
    An existing file at `csv_path` is replaced only with `force`, and never when it is the run file itself."""
    out, err = out or sys.stdout, err or sys.stderr
    if tensorboard is None and csv_path is None:
        raise InputError("nothing to export: name --tensorboard DIR and/or --csv FILE")
    file = os.path.join(path, "run.h5") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise InputError(f"{path}: no run file there (expected a run.h5 or a run folder holding one)")
    old_events = []
    if tensorboard is not None:
        _tensorboard()                  # a missing package is exit 2 before anything is written
        old_events = check_event_folder(tensorboard, overwrite)
    if csv_path is not None:
        check_file(csv_path, "--csv", inputs=[file], replace=force, force_flag="--force")
    if tensorboard is not None and csv_path is not None:
        check_distinct([("--tensorboard", tensorboard), ("--csv", csv_path)])
    try:
        run = report.read_run(file)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a bad input here, named with its reason
        raise InputError(f"{file}: cannot read it as a run file: {report.one_line(e)}") from None
    rows = len(run.metrics["round"])
    status = f"{rows} rounds, status {run.attrs.get('status', '?')}"
    try:
        if tensorboard is not None:
            clear_event_files(tensorboard, old_events)
            notes = []
            clients = read_clients(file, rows, notes)
            for note in notes:
                print(f"fedmpi: note: {note}", file=err)
            points, hists = write_tensorboard(run, clients, tensorboard)
            print(f"{file} ({status}): {points} scalar points and {hists} client histograms written to "
                  f"{tensorboard} (tensorboard --logdir {tensorboard})", file=out)
        if csv_path is not None:
            write_csv(run, csv_path)
            print(f"{file} ({status}): {rows} rows written to {csv_path}", file=out)
    except OSError as e:
        # The places were checked: this is the disk failing while writing (full, I/O error): exit 1, one line.
        raise FedmpiError(f"cannot write {e.filename or tensorboard or csv_path}: {e.strerror or e}") from None
    return 0
