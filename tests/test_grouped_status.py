"""Status and the comparison round in every grouped result (fedmpi.analysis.selection), on a folder of small real
runs (mnist5k, the lr model, in-process): finished, diverged (stopped, and gone on past a non-finite model),
failed and half-finished runs of two methods; FedSkip (delta 3) beside FedAvg with rounds 10.

Findings: a diverged run was averaged in without a word (summary, report --by, the CSV, the figure; its loss
scaled the panel); a run at round 6 of 10 was averaged beside finished ones; a run that went on past a NaN model
read as finished; FedSkip's final_acc (round 9) was compared with FedAvg's round 10, and grouping across methods
cut every curve to FedSkip's rounds 3, 6, 9."""

from __future__ import annotations

import csv
import shutil

import h5py
import numpy as np
import pytest
from conftest import small_config, write_config

import fedmpi.analysis as a
from fedmpi.analysis import overview
from fedmpi.cli import main
from fedmpi.io.store import RunLog
from fedmpi.mpi import signals

QUIET = {"threads": 1, "progress": "off"}
FEDAVG_LEFT_OUT = "+2 diverged, +1 failed, +2 running at rounds 4-6"


def _run(folder, name, **sections):
    cfg = small_config(folder / name, rounds=sections.pop("rounds", 10), **sections)
    folder.mkdir(parents=True, exist_ok=True)
    return main(["run", str(write_config(folder / f"{name}.yaml", cfg))])


def _half_finished(path, rounds):
    """A run still being written: its rows after `rounds` not there yet, status running."""
    RunLog(str(path)).truncate(rounds)
    with h5py.File(path, "a") as f:
        f.attrs["status"] = "running"


def _test_acc(folder, name):
    with h5py.File(folder / name / "run.h5", "r") as f:
        return f["metrics/test_acc"][()]


@pytest.fixture(scope="module")
def statuses(tmp_path_factory):
    """fedavg: seeds 1, 2 finished; 3 diverged (stopped); 4 went on past a non-finite model; 5 failed at round
    4; 6 and 7 still running at rounds 4 and 6. fedprox: seeds 1, 2 finished."""
    folder = tmp_path_factory.mktemp("statuses")
    runs = folder / "runs"
    for seed in (1, 2, 6, 7):
        assert _run(runs, f"fedavg-{seed}", seed=seed, runtime=QUIET) == 0
    for seed in (1, 2):
        assert _run(runs, f"fedprox-{seed}", seed=seed, algorithm={"name": "fedprox", "mu": 0.01},
                    runtime=QUIET) == 0
    blow_up = {"model": {"name": "mlp", "hidden": 32}, "client": {"lr": 1.0e6, "batch_size": 20}}
    with pytest.raises(SystemExit):
        _run(runs, "fedavg-3", seed=3, runtime=QUIET, **blow_up)
    assert _run(runs, "fedavg-4", seed=4, runtime={**QUIET, "on_nonfinite": "continue"}, **blow_up) == 0
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDMPI_INJECT_FAULT", "0:4")
    with pytest.raises(SystemExit):
        _run(runs, "fedavg-5", seed=5, runtime=QUIET)
    mp.undo()
    signals.reset()
    _half_finished(runs / "fedavg-6" / "run.h5", 4)
    _half_finished(runs / "fedavg-7" / "run.h5", 6)
    return folder


def test_every_grouped_view_uses_the_finished_runs_and_says_what_it_left_out(statuses, capsys):
    """H01/H02: summary, report --by, its CSV, table, group_summary and the figure's groups agree."""
    runs = statuses / "runs"
    finished = np.mean([_test_acc(runs, f"fedavg-{s}")[-1] for s in (1, 2)])
    df = a.runs(str(runs))
    status = dict(zip(df["run"], df["status"]))
    assert status["fedavg-3"] == "diverged" and status["fedavg-4"] == "diverged" and status["fedavg-5"] == "failed"
    assert status["fedavg-6"] == status["fedavg-7"] == "running"
    rows = {r["method"]: r for r in a.summary(df, by="method").to_dict("records")}
    assert rows["fedavg"]["n"] == 2 and rows["fedavg"]["left_out"] == FEDAVG_LEFT_OUT
    assert rows["fedavg"]["seed"] == "1,2" and rows["fedavg"]["round"] == 10
    assert rows["fedavg"]["final_acc_mean"] == pytest.approx(finished)
    assert rows["fedprox"]["n"] == 2 and rows["fedprox"]["left_out"] == ""

    csv_path = statuses / "grouped.csv"
    assert main(["report", str(runs), "--by", "method", "--csv", str(csv_path), "--force"]) == 0
    out = capsys.readouterr().out
    assert FEDAVG_LEFT_OUT in out and "compared at round 10" in out
    grouped = {r["method"]: r for r in csv.DictReader(open(csv_path))}
    for method, row in rows.items():
        assert grouped[method]["n"] == str(row["n"]) and grouped[method]["left_out"] == row["left_out"]
        assert grouped[method]["round"] == str(row["round"])
        assert float(grouped[method]["final_acc"]) == pytest.approx(row["final_acc_mean"])

    table = a.table(a.summary(df, by="method"), "markdown", ["final_acc"])
    assert f"| fedavg | 2, {FEDAVG_LEFT_OUT} | 10 | 1,2 | {100 * finished:.3f} ± " in table

    loaded = a.load_runs([str(runs)])
    members = [r for r in loaded if r.method == "fedavg"]
    group = a.group_summary(members)
    assert (group["n"], group["left_out"], group["round"]) == (2, FEDAVG_LEFT_OUT, 10)
    assert group["final_acc"] == pytest.approx(finished)

    groups = overview.groups_of(loaded, ("method",))
    assert set(groups) == {f"fedavg (n=2, {FEDAVG_LEFT_OUT})", "fedprox (n=2)"}
    assert sorted(r.name for r in groups[f"fedavg (n=2, {FEDAVG_LEFT_OUT})"]) == ["fedavg-1", "fedavg-2"]


def test_the_figure_draws_finished_runs_and_no_non_finite_value(statuses):
    """H01: the diverged run's loss scaled the panel; its points are not drawn, nor any non-finite one."""
    plt = a.pyplot()
    loaded = a.load_runs([str(statuses / "runs")])
    fedavg = [r for r in loaded if r.method == "fedavg"]
    fig, (ax, ax_all) = plt.subplots(1, 2)
    a.draw_groups(ax, overview.groups_of(fedavg, ("method",)), "test_loss", counted=False)
    [line] = ax.lines
    losses = np.array([r.metrics["test_loss"] for r in fedavg if r.name in ("fedavg-1", "fedavg-2")])
    assert list(line.get_xdata()) == list(range(1, 11)) and np.allclose(line.get_ydata(), losses.mean(axis=0))
    everything = overview.groups_of(fedavg, ("method",), include="all")
    assert [len(v) for v in everything.values()] == [7] and list(everything) == ["fedavg (n=7)"]
    a.draw_groups(ax_all, everything, "test_loss", counted=False)
    for axes in (ax, ax_all):
        assert all(np.isfinite(axes_line.get_ydata()).all() for axes_line in axes.lines)
        assert np.isfinite(axes.get_ylim()).all() and axes.get_ylim()[1] < 10
    plt.close(fig)
    assert main(["report", str(statuses / "runs"), "--by", "method", "--plot", str(statuses / "f.png"),
                 "--force"]) == 0
    # one line per run: those still being written are drawn, diverged and failed ones only when asked for
    assert a.plot_curves(fedavg, statuses / "c.png", metrics=("test_loss",)) == "+2 diverged, +1 failed"
    assert a.plot_curves(fedavg, statuses / "c.png", metrics=("test_loss",), include="all") == ""


def test_include_adds_the_statuses_asked_for(statuses, capsys):
    df = a.runs(str(statuses / "runs"))
    with pytest.warns(UserWarning, match="client.lr"):      # the diverged runs' settings differ
        rows = {r["method"]: r for r in a.summary(df, by="method", include="all").to_dict("records")}
    assert rows["fedavg"]["n"] == 7 and rows["fedavg"]["left_out"] == "" and rows["fedavg"]["round"] == 1
    with pytest.warns(UserWarning, match="client.lr"):
        rows = {r["method"]: r for r in a.summary(df, by="method", include=("diverged",)).to_dict("records")}
    assert rows["fedavg"]["n"] == 4 and rows["fedavg"]["left_out"] == "+1 failed, +2 running at rounds 4-6"
    csv_path = statuses / "with-running.csv"
    assert main(["report", str(statuses / "runs"), "--by", "method", "--include", "running,failed",
                 "--csv", str(csv_path), "--force"]) == 0
    grouped = {r["method"]: r for r in csv.DictReader(open(csv_path))}
    assert grouped["fedavg"]["n"] == "5" and grouped["fedavg"]["left_out"] == "+2 diverged"
    assert grouped["fedavg"]["round"] == "4"        # the last round the running run at round 4 evaluated
    capsys.readouterr()
    assert main(["report", str(statuses / "runs"), "--by", "method", "--include", "broken"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "include = broken" in err[0] and "diverged" in err[0]
    with pytest.raises(ValueError, match="include = broken"):
        a.summary(df, include="broken")


def test_the_per_run_table_marks_diverged_and_failed_runs(statuses, capsys):
    assert main(["report", str(statuses / "runs")]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines["fedavg-4"][2] == "diverged" and lines["fedavg-3"][2] == "diverged"
    assert lines["fedavg-5"][2] == "failed" and lines["fedavg-7"][2] == "running"


def test_going_on_past_a_non_finite_model_records_its_round_and_reads_as_diverged(statuses):
    """H03: a run at client.lr 1e6 with on_nonfinite continue was `finished` with no word of its NaN model."""
    with h5py.File(statuses / "runs" / "fedavg-4" / "run.h5", "r") as f:
        assert f.attrs["status"] == "finished" and int(f.attrs["nonfinite_round"]) == 1
        assert "non-finite entries in the global model" in str(f.attrs["nonfinite"])
    [row] = a.runs(str(statuses / "runs" / "fedavg-4")).to_dict("records")
    assert row["status"] == "diverged" and row["nonfinite_round"] == 1


def test_a_resume_before_the_non_finite_round_forgets_it(cadences, tmp_path):
    """A --resume from a checkpoint before the recorded round recomputes that round: the record goes."""
    for kept, recorded, stays in ((4, 5, False), (4, 3, True)):
        path = tmp_path / f"{kept}-{recorded}.h5"
        shutil.copy(cadences / "fedavg-1" / "run.h5", path)
        with h5py.File(path, "a") as f:
            f.attrs["nonfinite_round"], f.attrs["nonfinite"] = recorded, "test_loss nan"
        RunLog.reopen(str(path), kept)
        with h5py.File(path, "r") as f:
            assert ("nonfinite_round" in f.attrs) == stays and ("nonfinite" in f.attrs) == stays


@pytest.fixture(scope="module")
def cadences(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cadences")
    for seed in (1, 2):
        assert _run(folder, f"fedavg-{seed}", seed=seed, runtime=QUIET) == 0
        assert _run(folder, f"fedskip-{seed}", seed=seed, algorithm={"name": "fedskip", "delta": 3},
                    runtime=QUIET) == 0
    return folder


def test_fedskip_beside_fedavg_is_compared_at_round_9_and_says_so(cadences, capsys):
    """H05: FedSkip (delta 3, rounds 10) last evaluates at round 9; FedAvg beside it was taken at round 10."""
    at = {m: np.mean([_test_acc(cadences, f"{m}-{s}")[8] for s in (1, 2)]) for m in ("fedavg", "fedskip")}
    assert np.isnan(_test_acc(cadences, "fedskip-1")[9]) and np.isfinite(_test_acc(cadences, "fedavg-1")[9])
    summary = a.summary(a.runs(str(cadences)), by="method")
    rows = {r["method"]: r for r in summary.to_dict("records")}
    for method in ("fedavg", "fedskip"):
        assert rows[method]["round"] == 9 and rows[method]["final_acc_mean"] == pytest.approx(at[method])
        assert rows[method]["rounds_done_mean"] == 9
    assert "round 9" in summary.attrs["round"]
    csv_path = cadences / "g.csv"
    assert main(["report", str(cadences), "--by", "method", "--csv", str(csv_path), "--force"]) == 0
    assert "every group is compared at round 9 (the last round evaluated by every run" in capsys.readouterr().out
    grouped = {r["method"]: r for r in csv.DictReader(open(csv_path))}
    assert grouped["fedavg"]["round"] == "9" and float(grouped["fedavg"]["final_acc"]) == pytest.approx(at["fedavg"])
    assert "| 9 |" in a.table(summary, "markdown", ["final_acc"]).splitlines()[2]
    members = [r for r in a.load_runs([str(cadences)]) if r.method == "fedavg"]
    assert a.group_summary(members)["round"] == 10        # alone, FedAvg is taken at its own last round


def test_a_round_the_user_names(cadences, capsys):
    at6 = np.mean([_test_acc(cadences, f"fedavg-{s}")[5] for s in (1, 2)])
    rows = {r["method"]: r for r in a.summary(a.runs(str(cadences)), by="method", at_round=6).to_dict("records")}
    assert rows["fedavg"]["round"] == 6 and rows["fedavg"]["final_acc_mean"] == pytest.approx(at6)
    assert main(["report", str(cadences), "--by", "method", "--at-round", "6"]) == 0
    assert "compared at round 6 (the round asked for)" in capsys.readouterr().out
    for by in (["--by", "method"], []):
        assert main(["report", str(cadences), *by, "--at-round", "11"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "at_round = 11" in err[0] and "valid: 1 to 10" in err[0]
    csv_path = cadences / "per-run.csv"
    assert main(["report", str(cadences), "--at-round", "6", "--csv", str(csv_path), "--force"]) == 0
    assert "every run is compared at round 6" in capsys.readouterr().out
    per_run = {r["run"]: r for r in csv.DictReader(open(csv_path))}
    assert float(per_run["fedavg-1"]["final_acc"]) == pytest.approx(_test_acc(cadences, "fedavg-1")[5])
    assert per_run["fedskip-2"]["rounds_done"] == "6"


def test_a_method_on_its_own_cadence_never_cuts_the_others_curves(cadences):
    """H06: grouped across methods (--by partition.beta), FedSkip's unevaluated rounds cut every curve to 3, 6, 9."""
    plt = a.pyplot()
    loaded = a.load_runs([str(cadences)])
    groups = overview.groups_of(loaded, ("partition.beta",))
    fig, ax = plt.subplots()
    a.draw_groups(ax, groups, "test_acc", counted=False)
    [line] = ax.lines
    assert list(line.get_xdata()) == list(range(1, 11))
    acc = {r.name: np.asarray(r.metrics["test_acc"]) for r in loaded}
    assert line.get_ydata()[0] == pytest.approx(np.mean([acc["fedavg-1"][0], acc["fedavg-2"][0]]))
    assert line.get_ydata()[2] == pytest.approx(np.mean([v[2] for v in acc.values()]))
    plt.close(fig)


def _statuses_the_engine_writes():
    """Every status string fedmpi.run.launch records in run.h5 (log.finish / _fail), read from its source."""
    import re

    from fedmpi.run import launch

    text = open(launch.__file__).read()
    found = set(re.findall(r'finish\("(\w+)"', text)) | set(re.findall(r'status="(\w+)"', text))
    return sorted(found | {"running"})      # RunLog.create and reopen write running


@pytest.mark.parametrize("status", _statuses_the_engine_writes())
def test_every_status_the_engine_writes_has_a_category(status):
    from fedmpi.analysis import selection

    expected = status if status in ("finished", "diverged", "failed") else "running"
    assert selection.category(selection.run_status({"status": status})) == expected
    assert selection.run_status({"status": status, "nonfinite_round": 2}) == \
        ("diverged" if status == "finished" else status)
