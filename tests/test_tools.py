"""The analysis tools (tools/*.py, `fedmpi report`, fedmpi.analysis) on real run files: tables, CSV, PNG
curves and sweep summaries, also from files that are still being written, and the reproduction script.

The module's runs come from one MPI launch: a longer run that the fixture reads (and reports on) while
its job is still appending to it, then a small sweep (FSL with two gammas over two seeds, and FedAvg).
The views of the research instruments (--classes, --timing, the per-run figure, curves of divergence and
drift against simulated time) and the handling of malformed files and unwritable places are tested on
files written in the run log's layout by tests/run_files.py.
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import matplotlib.image
import numpy as np
import pytest
from conftest import MPI_TIMEOUT_S, ROOT, mpiexec, small_config, write_config
from run_files import write_run

from fedmpi import analysis
from fedmpi.analysis import class_report, report, timing_report
from fedmpi.cli import main as fedmpi_main

LIVE_ROUNDS = 40
SWEEP = {f"fsl-g{g}-s{s}": {"seed": s, "algorithm": {"name": "fsl", "gamma": g}} for g in (0.5, 1.0) for s in (0, 1)}
SWEEP["fedavg-s0"] = {"seed": 0}
SERVER = {"size": 100, "scheme": "iid"}


def tool(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / name), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def png_shape(path):
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(path).shape


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tools")
    # runtime.log_flush_s 0: a row per round (the whole run takes about a second), for the reader to catch
    live_cfg = small_config(base / "live", rounds=LIVE_ROUNDS, seed=3, partition={"clients": 12, "scheme": "iid"},
                            checkpoint={"every": 0}, runtime={"threads": 1, "progress": "lines", "log_flush_s": 0})
    paths = [write_config(base / "live.yaml", live_cfg)]
    for name, sections in SWEEP.items():
        cfg = small_config(base / "sweep" / name, rounds=4, server_data=SERVER, **sections)
        paths.append(write_config(base / f"{name}.yaml", cfg))
    log = open(base / "mpi.log", "w")
    proc = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, str(ROOT / "tools" / "run_batch.py"),
                             *map(str, paths), "--overwrite"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    live, seen, while_running = base / "live" / "run.h5", [], None
    deadline = time.monotonic() + MPI_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        if live.exists():
            run = report.read_run(str(live))        # must never fail, whatever the writer is doing
            seen.append((run.attrs["status"], len(run.metrics["round"])))
            if while_running is None and seen[-1][0] == "running" and 0 < seen[-1][1] < LIVE_ROUNDS:
                out, err = io.StringIO(), io.StringIO()
                code = analysis.report_command([str(live)], target=0.5, plot=str(base / "live.png"), out=out,
                                               err=err)
                while_running = (code, out.getvalue(), report.read_run(str(live)).attrs["status"])
        time.sleep(0.05)
    proc.wait(timeout=max(1, deadline - time.monotonic()))
    log.close()
    assert proc.returncode == 0, (base / "mpi.log").read_text()[-3000:]
    return {"base": base, "live": live, "sweep": base / "sweep", "seen": seen, "while_running": while_running}


@pytest.fixture
def half_written(runs, tmp_path):
    """A copy of a finished run as its job would leave it mid-append: status running, the last round's row
    present in `round` only, later rounds not yet written."""
    path = tmp_path / "partial" / "run.h5"
    path.parent.mkdir()
    shutil.copy(runs["live"], path)
    with h5py.File(path, "a") as f:
        f.attrs["status"] = "running"
        for name, ds in f["metrics"].items():
            ds.resize((30 if name == "round" else 29,) + ds.shape[1:])
        for ds in f["clients"].values():
            ds.resize((29, ds.shape[1]))
    return path


# --- per-run figures -------------------------------------------------------------------------------------

def test_summary_figures_follow_from_the_logged_metrics(runs):
    run = report.read_run(str(runs["live"]))
    m = run.metrics
    acc = m["test_acc"]
    [row] = report.summarize([run], target=float(acc[5]))
    assert row["rounds"] == LIVE_ROUNDS and row["status"] == "finished"
    assert row["final_acc"] == pytest.approx(acc[-20:].mean())
    assert row["best_acc"] == pytest.approx(acc.max())
    rolling = report.rolling_mean(acc)
    assert row["rise_round"] == np.flatnonzero(rolling >= 0.9 * row["final_acc"])[0] + 1
    first = np.flatnonzero(acc >= acc[5])[0]
    assert row["target_round"] == first + 1
    assert row["target_bytes"] == pytest.approx((m["bytes_up"][:first + 1] + m["bytes_down"][:first + 1]).sum())
    assert row["uploads"] == m["uploads"].sum() and row["wall_s"] == m["wall_s"][-1]
    assert row["bytes_moved"] == pytest.approx(m["bytes_up"].sum() + m["bytes_down"].sum())
    [never] = report.summarize([run], target=1.01)
    assert np.isnan(never["target_round"]) and np.isnan(never["target_bytes"])


# --- files still being written ----------------------------------------------------------------------------

def test_a_run_is_read_and_reported_while_its_job_writes_it(runs):
    seen = runs["seen"]
    running = [n for status, n in seen if status == "running"]
    assert running and min(running) >= 0 and all(0 <= n <= LIVE_ROUNDS for n in running)
    assert [n for _, n in seen] == sorted(n for _, n in seen)          # rows only ever grow
    assert runs["while_running"] is not None, f"never caught the run mid-way: {seen[:5]}...{seen[-5:]}"
    code, table, _ = runs["while_running"]
    assert code == 0 and "running" in table and "target_round" in table
    assert png_shape(runs["base"] / "live.png")[0] > 0


def test_every_error_of_a_file_mid_append_is_retried_and_the_last_one_raised(monkeypatch, tmp_path):
    # HDF5 reports a group whose heap the writer is extending as RuntimeError ("addr overflow"): a reader
    # that meets it on a live file retries, as it does for OSError, KeyError and ValueError.
    path = write_run(tmp_path / "run.h5")
    real, calls = report._read_run, []

    def flaky(p):
        calls.append(p)
        if len(calls) <= 3:
            raise (RuntimeError, OSError, KeyError)[len(calls) - 1]("Unable to get group info (addr overflow)")
        return real(p)

    monkeypatch.setattr(report, "_read_run", flaky)
    monkeypatch.setattr(report.time, "sleep", lambda s: None)
    assert len(report.read_run(str(path)).metrics["round"]) > 0 and len(calls) == 4

    def never_settles(p):
        calls.append(p)
        raise RuntimeError("addr overflow")

    calls.clear()
    monkeypatch.setattr(report, "_read_run", never_settles)
    with pytest.raises(RuntimeError, match="addr overflow"):
        report.read_run(str(path), retries=3)
    assert len(calls) == 3


def test_tools_on_a_half_appended_file(half_written, tmp_path):
    proc = tool("compare.py", half_written, "--csv", tmp_path / "t.csv", "--plot", tmp_path / "c.png")
    assert proc.returncode == 0, proc.stderr
    assert "running" in proc.stdout and " 29 " in proc.stdout
    [row] = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert row["status"] == "running" and row["rounds"] == "29"
    proc = tool("curves.py", half_written.parent, "--out", tmp_path / "curves.png")
    assert proc.returncode == 0, proc.stderr
    proc = tool("sweep.py", half_written, "--by", "seed", "--plot", tmp_path / "s.png")
    assert proc.returncode == 0, proc.stderr
    assert all(png_shape(tmp_path / n)[0] > 0 for n in ("c.png", "curves.png", "s.png"))


# --- tables, CSV, curves ------------------------------------------------------------------------------------

def test_compare_writes_table_csv_and_png(runs, tmp_path):
    proc = tool("compare.py", runs["sweep"], "--target", "0.3", "--csv", tmp_path / "t.csv", "--plot",
                tmp_path / "acc.png", "--x", "bytes", "--format", "markdown")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + len(SWEEP)
    for column in ("final_acc", "best_acc", "rise_round", "target_round", "target_bytes", "uploads", "bytes_moved",
                   "wall_s"):
        assert column in lines[0]
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert sorted(r["run"] for r in rows) == sorted(SWEEP)
    assert all(0 < float(r["final_acc"]) <= 1 for r in rows)
    assert png_shape(tmp_path / "acc.png")[:2] == (504, 1440)      # two panels: accuracy and loss


def test_fedmpi_report_is_the_same_code(runs, capsys, tmp_path):
    args = [str(runs["sweep"]), "--target", "0.3"]
    assert fedmpi_main(["report", *args]) == 0
    via_cli = capsys.readouterr().out
    out = io.StringIO()
    assert analysis.report_command([str(runs["sweep"])], target=0.3, out=out) == 0
    assert via_cli == out.getvalue()
    assert tool("compare.py", *args).stdout == via_cli
    assert fedmpi_main(["report", str(tmp_path / "nothing-here")]) == 2


def test_curves_against_rounds_and_bytes(runs, tmp_path):
    proc = tool("curves.py", runs["sweep"], "--out", tmp_path / "one.png", "--metric", "test_acc", "--x", "bytes",
                "--label-by", "algorithm.gamma", "--smooth", "2")
    assert proc.returncode == 0, proc.stderr
    assert png_shape(tmp_path / "one.png")[:2] == (504, 720)
    proc = tool("curves.py", str(runs["sweep"] / "*"), "--out", tmp_path / "three.png", "--metric", "test_acc",
                "--metric", "test_loss", "--metric", "server_loss", "--x", "wall")
    assert proc.returncode == 0, proc.stderr
    assert png_shape(tmp_path / "three.png")[:2] == (504, 2160)


def test_curve_x_axes(runs):
    run = report.read_run(str(runs["live"]))
    x, y = analysis.curve(run, "test_acc", "round")
    np.testing.assert_array_equal(x, np.arange(1, LIVE_ROUNDS + 1))
    x, _ = analysis.curve(run, "test_acc", "bytes")
    assert np.all(np.diff(x) > 0) and x[-1] == pytest.approx(report.summarize([run])[0]["bytes_moved"])


# --- sweeps -------------------------------------------------------------------------------------------------

def test_sweep_groups_by_a_config_key_with_mean_and_spread(runs):
    all_runs = analysis.load_runs([str(runs["sweep"])])
    rows = analysis.sweep_rows(all_runs, ["algorithm.gamma"], target=0.3)
    assert [r["algorithm.gamma"] for r in rows] == ["0.5", "1.0", "None"]      # fedavg has no gamma
    for row, gamma in zip(rows[:2], (0.5, 1.0)):
        members = [r for r in all_runs if analysis.config_value(r, "algorithm.gamma") == gamma]
        finals = [s["final_acc"] for s in report.summarize(members)]
        assert row["runs"] == 2 and row["seeds"] == "0,1"
        assert row["final_acc"] == pytest.approx(np.mean(finals))
        assert row["final_acc_std"] == pytest.approx(np.std(finals, ddof=1))
    assert rows[2]["runs"] == 1 and np.isnan(rows[2]["final_acc_std"])
    by_name = analysis.sweep_rows(all_runs, ["algorithm"])
    assert {r["algorithm"]: r["runs"] for r in by_name} == {"fedavg": 1, "fsl": 4}


def test_sweep_tool_writes_table_csv_and_png(runs, tmp_path):
    proc = tool("sweep.py", runs["sweep"], "--by", "algorithm.gamma", "--by", "seed", "--csv", tmp_path / "s.csv",
                "--plot", tmp_path / "s.png", "--target", "0.3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split()[:4] == ["algorithm.gamma", "seed", "runs", "seeds"]
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert len(rows) == len(SWEEP) and {"final_acc", "final_acc_std", "reached"} <= set(rows[0])
    proc = tool("sweep.py", runs["sweep"], "--by", "algorithm.gamma", "--format", "markdown")
    assert "±" in proc.stdout and proc.stdout.startswith("| algorithm.gamma |")
    assert png_shape(tmp_path / "s.png")[0] > 0


# --- finding and skipping files ---------------------------------------------------------------------------

def test_run_files_are_found_in_folders_and_globs_and_bad_ones_are_skipped(runs, tmp_path):
    files, unmatched = analysis.find_run_files([str(runs["sweep"]), str(runs["sweep"] / "fsl-*" / "run.h5"),
                                                str(tmp_path / "missing")])
    assert len(files) == len(SWEEP) and unmatched == [str(tmp_path / "missing")]
    bad = tmp_path / "bad" / "run.h5"
    bad.parent.mkdir()
    bad.write_text("not hdf5")
    err = io.StringIO()
    assert analysis.load_runs([str(bad), str(runs["live"])], err=err)[0].path == str(runs["live"])
    assert "skipping" in err.getvalue() and str(bad) in err.getvalue()


# --- tools/run_batch.py and tools/reproduce.py -------------------------------------------------------------

def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module      # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_run_batch_plans_every_config_and_seed_and_protects_existing_runs(tmp_path, capsys):
    batch = load_tool("run_batch")
    configs = [str(ROOT / "jobs" / "configs" / "repro" / "safl" / f"{n}.yaml") for n in ("fedavg", "safl")]
    args = batch.parse([*configs, "--seeds", "0", "1", "--out-root", str(tmp_path), "rounds=3"])
    plan = batch.plan(args)
    assert [name for name, _ in plan] == ["fedavg-seed0", "fedavg-seed1", "safl-seed0", "safl-seed1"]
    assert [(c.seed, c.rounds, c.out) for _, c in plan][1] == (1, 3, str(tmp_path / "fedavg-seed1"))
    (tmp_path / "safl-seed1").mkdir()
    (tmp_path / "safl-seed1" / "run.h5").write_bytes(b"")
    assert batch.main([*configs, "--seeds", "0", "1", "--out-root", str(tmp_path)]) == 2
    assert "safl-seed1" in capsys.readouterr().err
    assert batch.main([configs[0], "seed=-1"]) == 2


@pytest.mark.mpi
def test_reproduce_one_paper_writes_its_section_figure_and_csv(tmp_path):
    """tools/reproduce.py --paper safl end to end at 2 rounds and one seed: its section of reproduction.md
    (table, claims checked, figure), the other papers' sections kept as they were."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reproduction.md").write_text("# old\n<!-- paper:zhao -->\nZHAO KEPT\n<!-- /paper:zhao -->\n")
    proc = subprocess.run([sys.executable, "tools/reproduce.py", "--paper", "safl", "--rounds", "2", "--seeds", "0",
                           "--threads", "1", "--runs", str(tmp_path / "runs"), "--docs", str(docs)], cwd=ROOT,
                          capture_output=True, text=True, timeout=MPI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (docs / "reproduction.md").read_text()
    assert "ZHAO KEPT" in text and "Not run yet: `python tools/reproduce.py --paper fsl`" in text
    safl = text[text.index("<!-- paper:safl -->"):text.index("<!-- /paper:safl -->")]
    assert "`python tools/reproduce.py --paper safl --rounds 2 --seeds 0`" in safl
    table = [line for line in safl.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + 6 and "paper's number or claim" in table[0]
    assert sum(line.startswith(("- **holds**", "- **does not hold**", "- **measured**"))
               for line in safl.splitlines()) == 5
    rows = list(csv.DictReader(open(docs / "reproduction_safl.csv")))
    assert len(rows) == 6 and all(r["runs"] == "1" for r in rows)
    assert png_shape(docs / "reproduction_safl.png")[0] > 0
    assert sorted(os.listdir(tmp_path / "runs" / "safl")) == sorted([f"{n}-seed0" for n in (
        "fedavg_group_a", "fedavg", "safl", "safl_gated", "safl_gated_half", "safl_gated_half_eor")]
        + ["launch_wall_s.txt"])
    wall = float((tmp_path / "runs" / "safl" / "launch_wall_s.txt").read_text())
    assert f"6 runs took {wall / 60:.1f} minutes of wall time" in safl


def test_reproduce_knows_every_paper_config():
    """Every config of jobs/configs/repro/<paper>/ is a row of that paper's section, and back."""
    repro = load_tool("reproduce")
    for key, paper in repro.PAPERS.items():
        on_disk = {p.stem for p in (ROOT / "jobs" / "configs" / "repro" / key).glob("*.yaml")}
        assert on_disk == {s.config for s in paper.settings}, key


def test_zhao_divergence_claims_are_judged_on_the_numbers():
    repro = load_tool("reproduce")
    rows = {name: {"divergence": d, "divergence_std": 0.01} for name, d in [
        ("fedavg_iid", 0.2), ("fedavg_2class", 0.4), ("fedavg_1class", 0.5),
        ("share_beta0", 0.5), ("share_beta5", 0.4), ("share_beta10", 0.45), ("share_beta20", 0.3)]}
    skew, sharing = repro._divergence_checks(rows)
    assert skew[0] is True and "IID 0.200 ± 0.010, 2-class 0.400" in skew[2]
    assert sharing[0] is False and "beta 10%: 0.450 ± 0.010" in sharing[2]     # 0.45 > 0.4: not monotone
    assert repro._divergence_checks({name: {} for name in rows}) == []          # runs without the shadow


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
    final = evaluated[-20:].mean(axis=0)
    lines = section(out, "run", "per-class accuracy")
    assert lines[0].endswith("(final = mean of the last 15 of 15 evaluations)")
    assert lines[1] == "lost (final accuracy below half the mean over classes): 2"
    header, table = lines[2].split(), [line.split() for line in lines[4:]]
    assert header == ["class", "final_acc", "best_acc", "test_n", "train_n", "clients"]
    assert [int(r[0]) for r in table] == list(np.argsort(final))        # worst first
    for r in table:
        c = int(r[0])
        assert float(r[1]) == pytest.approx(final[c], abs=5e-5)
        assert float(r[2]) == pytest.approx(np.nanmax(acc[:, c]), abs=5e-5)
        assert [int(x) for x in r[3:]] == [counts[c], labels[:, c].sum(), (labels[:, c] > 0).sum()]
    # Weighted by the test samples per class, the classes' final accuracies are the run's final accuracy.
    rows = class_report.class_rows(report.read_run(str(path)))
    weighted = sum(r["final_acc"] * r["test_n"] for r in rows) / sum(r["test_n"] for r in rows)
    assert weighted == pytest.approx(report.summarize([report.read_run(str(path))])[0]["final_acc"])


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
    code, out, _ = report_cli(capsys, tmp_path / "runs", "--timing", "--plot", tmp_path / "fig.png")
    assert code == 0
    assert png_shape(tmp_path / "fig.png")[:2] == (504, 1440)                 # the curves, as before
    assert png_shape(tmp_path / "fig-full.png")[:2] == (504, 2160)            # accuracy, divergence, classes
    assert png_shape(tmp_path / "fig-classes.png")[:2] == (504, 1440)         # accuracy, classes
    assert not (tmp_path / "fig-old.png").exists()                            # nothing beyond the curves
    assert png_shape(tmp_path / "fig-timing.png")[0] == 504                   # only "full" recorded timing
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
    assert png_shape(tmp_path / "c.png")[:2] == (504, 1440)
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
    assert png_shape(tmp_path / "p-good.png")[0] > 0
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
