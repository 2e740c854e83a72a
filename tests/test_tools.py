"""The analysis tools (tools/*.py, `fedmpi report`, fedmpi.analysis) on real run files: tables, CSV, PNG
curves and sweep summaries, also from files that are still being written, and the reproduction script.

The module's runs come from one MPI launch: a longer run that the fixture reads (and reports on) while
its job is still appending to it, then a small sweep (FSL with two gammas over two seeds, and FedAvg).
The views of the research instruments (--classes, --timing, the per-run figure, curves of divergence and
drift against simulated time) and the handling of malformed files and unwritable places are tested on
files written in the run log's layout by tests/run_files.py, in tests/test_tools_views.py.
"""

from __future__ import annotations

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
from fedmpi.analysis import report
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
    assert row["rounds_done"] == LIVE_ROUNDS and row["status"] == "finished"
    assert row["final_acc"] == acc[-1]                              # evaluated every round: the last one
    assert row["acc_last20_mean"] == pytest.approx(acc[-20:].mean())
    assert row["best_acc"] == pytest.approx(acc.max())
    rolling = report.rolling_mean(acc)
    assert row["rise_round"] == np.flatnonzero(rolling >= 0.9 * row["acc_last20_mean"])[0] + 1
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
    assert row["status"] == "running" and row["rounds_done"] == "29"
    [frame] = analysis.runs(str(half_written)).to_dict("records")       # the Python API reads it alike
    assert frame["status"] == "running" and frame["rounds_done"] == 29
    assert analysis.rounds(str(half_written), metrics=["train_loss"])["round"].max() == 29
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
    height, width = png_shape(tmp_path / "acc.png")[:2]
    assert 2.0 < width / height < 3.0       # one figure: accuracy and loss against bytes (the --x), a row of two


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
    one = png_shape(tmp_path / "one.png")[:2]
    assert 1.1 < one[1] / one[0] < 1.7                                  # one panel
    proc = tool("curves.py", str(runs["sweep"] / "*"), "--out", tmp_path / "three.png", "--metric", "test_acc",
                "--metric", "test_loss", "--metric", "server_loss", "--x", "wall")
    assert proc.returncode == 0, proc.stderr
    three = png_shape(tmp_path / "three.png")[:2]
    assert 2.6 < three[1] / one[1] < 3.4                                # three panels


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
        assert row["n"] == 2 and row["seeds"] == "0,1"
        assert row["final_acc"] == pytest.approx(np.mean(finals))
        assert row["final_acc_std"] == pytest.approx(np.std(finals, ddof=1))
    assert rows[2]["n"] == 1 and np.isnan(rows[2]["final_acc_std"])
    by_name = analysis.sweep_rows(all_runs, ["algorithm"])
    assert {r["algorithm"]: r["n"] for r in by_name} == {"fedavg": 1, "fsl": 4}


def test_sweep_tool_writes_table_csv_and_png(runs, tmp_path):
    proc = tool("sweep.py", runs["sweep"], "--by", "algorithm.gamma", "--by", "seed", "--csv", tmp_path / "s.csv",
                "--plot", tmp_path / "s.png", "--target", "0.3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split()[:4] == ["algorithm.gamma", "seed", "n", "seeds"]
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
    assert skew[0] == "holds" and "IID 0.200 ± 0.010, 2-class 0.400" in skew[2]
    assert sharing[0].startswith("does not hold (the gap -0.05 against the claim exceeds the seeds' spread 0.01")
    assert "beta 10%: 0.450 ± 0.010" in sharing[2]     # 0.45 > 0.4: not monotone
    assert repro._divergence_checks({name: {} for name in rows}) == []          # runs without the shadow

