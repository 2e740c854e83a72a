"""The analysis tools on files written in the run log's layout by tests/run_files.py (no MPI launch): the
research instruments' views (--classes, --timing, the per-run figure, curves of divergence and drift against
simulated time), malformed files skipped and unwritable places refused (exit 2), and the tools' hygiene.
Split from tests/test_tools.py by topic: that file has the tools on real run files from one MPI launch and
the reproduction script."""

from __future__ import annotations

import ast
import csv
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import ROOT
from run_files import write_run
from test_tools import png_shape, tool

from fedmpi import analysis
from fedmpi.analysis import class_report, report, timing_report
from fedmpi.cli import main as fedmpi_main

# --- the research instruments' views (files in the run log's layout, tests/run_files.py) -------------------

def report_cli(capsys, *args):
    code = fedmpi_main(["report", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def section(out, run_name, heading):
    """The lines of one run's --classes/--timing section: from its heading to the next blank line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{run_name}: {heading}"))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_classes_lists_each_class_worst_first_beside_the_label_counts(tmp_path, capsys):
    path = write_run(tmp_path / "run" / "run.h5", rounds=30, eval_every=2)
    with h5py.File(path, "a") as f:         # class 2 is lost after round 4 (test_acc follows, as a writer's would)
        acc = f["metrics/class_acc"][()]
        acc[4:, 2] = np.where(np.isnan(acc[4:, 2]), np.nan, 0.01)
        f["metrics/class_acc"][...] = acc
        labels, counts = f["partition/labels"][()], f["metrics/class_acc"].attrs["class_counts"]
        f["metrics/test_acc"][...] = (acc * counts).sum(axis=1) / counts.sum()
    code, out, _ = report_cli(capsys, path, "--classes")
    assert code == 0
    evaluated = acc[np.isfinite(acc).any(axis=1)]                      # 15 evaluations of 30 rounds
    smooth, final = evaluated[-20:].mean(axis=0), evaluated[-1]
    lines = section(out, "run", "per-class accuracy")
    assert lines[0].endswith("acc_last20_mean: mean of the last 15 of 15 evaluations)")
    assert lines[1] == "lost (acc_last20_mean below half its mean over classes): 2"
    header, table = lines[2].split(), [line.split() for line in lines[4:]]
    assert header == ["class", "final_acc", "acc_last20_mean", "best_acc", "test_n", "train_n", "clients"]
    assert [int(r[0]) for r in table] == list(np.argsort(smooth))        # worst first
    for r in table:
        c = int(r[0])
        assert float(r[1]) == pytest.approx(final[c], abs=5e-5)
        assert float(r[2]) == pytest.approx(smooth[c], abs=5e-5)
        assert float(r[3]) == pytest.approx(np.nanmax(acc[:, c]), abs=5e-5)
        assert [int(x) for x in r[4:]] == [counts[c], labels[:, c].sum(), (labels[:, c] > 0).sum()]
    # Weighted by the test samples per class, the classes' figures are the run's.
    rows = class_report.class_rows(report.read_run(str(path)))
    summary = report.summarize([report.read_run(str(path))])[0]
    for name in ("final_acc", "acc_last20_mean"):
        weighted = sum(r[name] * r["test_n"] for r in rows) / sum(r["test_n"] for r in rows)
        assert weighted == pytest.approx(summary[name])


def test_classes_and_timing_say_not_recorded_on_older_files(tmp_path, capsys):
    write_run(tmp_path / "old" / "run.h5", fingerprints=False, instruments=False, timing=False)
    code, out, _ = report_cli(capsys, tmp_path / "old", "--classes", "--timing")
    assert code == 0
    assert "old: per-class accuracy not recorded (/metrics/class_acc)" in out
    assert "old: phase timing not recorded (/timing)" in out


def test_timing_table_is_the_mean_seconds_per_round_of_each_phase_and_rank(tmp_path, capsys):
    path = write_run(tmp_path / "run" / "run.h5", rounds=7, ranks=4)
    with h5py.File(path, "a") as f:
        f["timing/train"][2, 0] = np.nan     # the server trains nothing: not measured is not zero
        timing = {k: ds[()] for k, ds in f["timing"].items()}
    code, out, _ = report_cli(capsys, path, "--timing")
    assert code == 0
    lines = section(out, "run", "mean seconds per round")
    assert lines[0] == "run: mean seconds per round over 7 rounds, by rank and phase"
    header = lines[1].split()
    assert header == ["rank", "role", "bcast", "train", "reduce", "wait", "server", "eval", "total"]
    for rank, line in enumerate(lines[3:]):
        cells = line.split()
        assert cells[:2] == [str(rank), "server" if rank == 0 else "worker"]
        means = {p: np.nanmean(timing[p][:, rank]) for p in header[2:-1]}
        for phase, cell in zip(header[2:-1], cells[2:-1]):
            assert float(cell) == pytest.approx(means[phase], abs=5e-5)
        assert float(cells[-1]) == pytest.approx(sum(means.values()), abs=5e-4)
    assert len(lines) == 3 + 4


def test_plot_draws_a_figure_per_instrumented_run_and_the_timing_bars(tmp_path, capsys):
    write_run(tmp_path / "runs" / "full" / "run.h5")
    write_run(tmp_path / "runs" / "old" / "run.h5", fingerprints=False, instruments=False, timing=False)
    classes_only = write_run(tmp_path / "runs" / "classes" / "run.h5", timing=False)
    with h5py.File(classes_only, "a") as f:
        for name in ("weight_divergence", "weight_divergence_layers", "shadow_acc"):
            del f["metrics"][name]
    code, out, _ = report_cli(capsys, tmp_path / "runs", "--timing", "--plot", tmp_path / "one.png")
    assert code == 0
    assert png_shape(tmp_path / "one.png")[0] > 0               # one figure for the folder: nothing per run unasked
    assert sorted(p.name for p in tmp_path.glob("one*.png")) == ["one-timing.png", "one.png"]
    code, out, _ = report_cli(capsys, tmp_path / "runs", "--timing", "--plot", tmp_path / "fig.png", "--per-run")
    assert code == 0
    # saved with the bounding box fitted around the labels: a panel is ~6 inches at 120 dpi, the height alike
    full, classes, old = (png_shape(tmp_path / f"fig-{name}.png") for name in ("full", "classes", "old"))
    assert 2.6 < full[1] / old[1] < 3.4 and 1.6 < classes[1] / old[1] < 2.4     # 3, 2 and 1 panels
    assert abs(full[0] - old[0]) < 60
    assert abs(png_shape(tmp_path / "fig-timing.png")[0] - old[0]) < 60      # one row: only "full" recorded timing
    assert f"phase timing written to {tmp_path / 'fig-timing.png'}" in out
    assert timing_report.plot_timing([report.read_run(str(tmp_path / "runs" / "old" / "run.h5"))],
                                     str(tmp_path / "none.png")) is False


def test_curves_draw_divergence_and_drift_against_simulated_time(tmp_path):
    path = write_run(tmp_path / "new" / "run.h5")
    write_run(tmp_path / "old" / "run.h5", fingerprints=False, instruments=False, timing=False)
    run = report.read_run(str(path))
    x, y = analysis.curve(run, "weight_divergence", "sim_time")
    np.testing.assert_array_equal(x, run.metrics["sim_time_s"])
    np.testing.assert_array_equal(y, run.metrics["weight_divergence"])
    x, y = analysis.curve(run, "gradient_diversity", "round")
    np.testing.assert_array_equal(y, run.metrics["update_sq_norm"] / run.metrics["aggregate_sq_norm"])
    assert len(analysis.curve(run, "class_acc", "round")[0]) == 0              # not one value per round
    proc = tool("curves.py", tmp_path / "new", tmp_path / "old", "--out", tmp_path / "c.png", "--x", "sim_time",
                "--metric", "weight_divergence", "--metric", "gradient_diversity")
    assert proc.returncode == 0, proc.stderr
    height, width = png_shape(tmp_path / "c.png")[:2]
    assert 2.2 < width / height < 3.2                       # two panels side by side (4.2 x 12 inches)
    assert "old: sim_time_s not recorded" in proc.stderr


# --- malformed files are skipped; unwritable places are exit 2 (issue 17, finding 12) ---------------------

def malformed_files(base):
    """{name: path} of files that are valid HDF5 but not run logs, each in its own way."""
    def broken(name, edit):
        path = write_run(base / name / "run.h5", fingerprints=False, instruments=False, timing=False)
        with h5py.File(path, "a") as f:
            edit(f)
        return path

    def replace(name, value):
        def edit(f):
            del f["metrics"][name]
            f["metrics"][name] = value
        return edit

    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    return {
        "not-yaml": broken("not-yaml", lambda f: f.attrs.__setitem__("config", "seed: [1, 2\n  x: {")),
        "yaml-text": broken("yaml-text", lambda f: f.attrs.__setitem__("config", "just a sentence")),
        "alias-bomb": broken("alias-bomb", lambda f: f.attrs.__setitem__("config", bomb)),
        "scalar-metric": broken("scalar-metric", replace("test_acc", 0.5)),
        "string-metric": broken("string-metric", replace("train_loss", np.array([b"a", b"b"] * 3))),
        "two-d-core": broken("two-d-core", replace("test_acc", np.zeros((6, 2)))),
        "no-metrics": broken("no-metrics", lambda f: f.__delitem__("metrics")),
        "no-round": broken("no-round", lambda f: f["metrics"].__delitem__("round")),
        "metrics-dataset": broken("metrics-dataset", lambda f: (f.__delitem__("metrics"),
                                                               f.create_dataset("metrics", data=[1.0]))),
        "string-partition": broken("string-partition", lambda f: (f["partition"].__delitem__("samples"),
                                                                 f["partition"].create_dataset("samples",
                                                                                               data=[b"x"] * 5))),
    }


def test_malformed_files_are_skipped_with_one_warning_each(tmp_path, capsys):
    bad = malformed_files(tmp_path / "runs")
    write_run(tmp_path / "runs" / "good" / "run.h5")
    code, out, err = report_cli(capsys, tmp_path / "runs", "--classes", "--timing", "--csv", tmp_path / "t.csv",
                                "--plot", tmp_path / "p.png")
    assert code == 0, err
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if line.startswith("fedmpi: warning: skipping")]
    assert len(warnings) == len(bad) and len(err.strip().splitlines()) == len(bad)
    for path in bad.values():
        [line] = [w for w in warnings if f"skipping {path}:" in w]
        assert len(line) < 400, line
    assert [r["run"] for r in csv.DictReader(open(tmp_path / "t.csv"))] == ["good"]
    assert png_shape(tmp_path / "p.png")[0] > 0
    for script, args in (("curves.py", ["--out", tmp_path / "c.png"]), ("sweep.py", ["--by", "seed"]),
                         ("compare.py", [])):
        proc = tool(script, tmp_path / "runs", *args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (script, proc.stderr)
        assert sum("skipping" in line for line in proc.stderr.splitlines()) == len(bad), script
    # Only malformed files: nothing to report, exit 2 after the warnings.
    code, _, err = report_cli(capsys, *bad.values())
    assert code == 2 and "none of the run files could be read" in err


def unwritable_folder(tmp_path):
    """A folder this process cannot write into (root ignores permission bits: then a sysfs path)."""
    if os.geteuid() == 0:
        return Path("/sys")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def test_unwritable_places_exit_2_naming_the_path_before_any_output(tmp_path, capsys):
    run = write_run(tmp_path / "run" / "run.h5")
    read_only = unwritable_folder(tmp_path)
    (tmp_path / "a-file").write_text("")        # missing folders are made (mkdir -p); a file in the way is not
    cases = [("--csv", tmp_path, "is a folder"), ("--csv", tmp_path / "a-file" / "t.csv", "is a file"),
             ("--csv", read_only / "t.csv", "cannot write there"),
             ("--plot", read_only / "p.png", "cannot write there"),
             ("--plot", tmp_path / "a-file" / "p.png", "is a file")]
    for option, path, reason in cases:
        code, out, err = report_cli(capsys, run, option, path)
        assert code == 2 and out == "", (option, path, out)
        assert err.startswith(f"fedmpi: error: {option} {path}") and reason in err, err
        assert len(err.strip().splitlines()) == 1
    proc = tool("sweep.py", run, "--by", "seed", "--csv", tmp_path / "a-file" / "s.csv")
    assert proc.returncode == 2 and str(tmp_path / "a-file") in proc.stderr and "Traceback" not in proc.stderr
    proc = tool("curves.py", run, "--out", read_only / "c.png")
    assert proc.returncode == 2 and str(read_only / "c.png") in proc.stderr and "Traceback" not in proc.stderr


# --- hygiene (issue 11, item 7) -----------------------------------------------------------------------------

def test_report_does_not_import_analysis():
    """analysis builds on report; report (the per-run figures) must not reach back, not even lazily."""
    tree = ast.parse((ROOT / "fedmpi" / "analysis" / "report.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    # the cross-run analysis is the package's own module (fedmpi/analysis/__init__.py); its siblings are fine
    assert "fedmpi.analysis" not in imported
    assert not hasattr(report, "plot_curves")
