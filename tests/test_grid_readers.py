"""The paper grids' readers (tools/robustness.py, tools/personalization.py, tools/reproduce.py) on fabricated
sweeps: for every spec of jobs/sweeps/ a tool reads, one finished run file per experiment holding the config the
sweep gives that experiment (fedmpi.sweep.configs), written without training (tests/run_files.py). Each tool
must map every experiment to exactly one cell of its table and fill every cell; a run that is missing, or an
experiment the sweep's index says was refused, shows as such. The cells come from the spec's own experiment
list, so a cell added to a spec is covered here without editing this file."""

from __future__ import annotations

import csv
import shutil

import h5py
import numpy as np
import pytest
import yaml
from conftest import ROOT, tool_module
from run_files import write_run

from fedmpi.sweep import configs, index, spec

SWEEPS = ROOT / "jobs" / "sweeps"
ROUNDS = 6


def load_tool(name):
    return tool_module(name, "grid_reader")


def fake_sweep(spec_file, out, local_eval=False):
    """A finished run in OUT/NAME for every experiment of the spec, recording the config the sweep builds for
    it; returns the Spec."""
    s = spec.load(spec_file)
    for exp, cfg in zip(s.experiments, configs.build(s)):
        path = write_run(out / exp.name / "run.h5", rounds=ROUNDS, config=yaml.safe_load(cfg.to_yaml()),
                         fingerprints=False, instruments=False, timing=False, model=False)
        with h5py.File(path, "a") as f:
            if cfg.attack.name == "backdoor":
                f["metrics"]["backdoor_acc"] = np.linspace(0.2, 0.9, ROUNDS)
            for name, value in (("local_acc_mean", 0.6), ("local_acc_worst10", 0.2)) if local_eval else ():
                f["metrics"][name] = np.r_[np.full(ROUNDS - 1, np.nan), value]
    return s


def refuse(out, s, names, message):
    """The sweep's index as a sweep that refused the experiments `names` leaves it (the others finished)."""
    rows = [index.Row(e.name, status="refused" if e.name in names else "finished", folder=str(out / e.name),
                      seed=e.overrides["seed"], message=message if e.name in names else "") for e in s.experiments]
    index.write(str(out), rows)
    for name in names:
        shutil.rmtree(out / name)


def cell_runs(s, **labels):
    """The names of the experiments of the cell with these set names."""
    return [e.name for e in s.experiments if all(e.labels[k] == v for k, v in labels.items())]


def axes_of(s):
    """{axis: [its set names in the spec's order]} of a spec's experiments."""
    axes = {}
    for e in s.experiments:
        for axis, label in e.labels.items():
            axes.setdefault(axis, []).append(label)
    return {axis: list(dict.fromkeys(labels)) for axis, labels in axes.items()}


@pytest.fixture(scope="module")
def robustness(tmp_path_factory):
    out = tmp_path_factory.mktemp("robustness") / "sweep"
    return load_tool("robustness"), fake_sweep(SWEEPS / "robustness.yaml", out), out


def test_robustness_maps_every_experiment_to_one_filled_cell(robustness, tmp_path, capsys):
    tool, s, out = robustness
    _, results = tool.sweep_results.read(SWEEPS / "robustness.yaml", str(out))
    assert [r.status for r in results] == ["finished"] * len(s.experiments)
    cells = tool.read_cells(results)
    axes = axes_of(s)
    seeds = {e.overrides["seed"] for e in s.experiments}
    assert len(cells) == np.prod([len(v) for v in axes.values()])            # one cell per combination
    assert all(len(c["acc"]) == len(seeds) and not c["absent"] for c in cells.values())
    shown = [set(tool.axis_values(cells, i)) for i in range(3)]
    assert shown == [set(t) for t in (tool.PARTITIONS, tool.ATTACKS, tool.AGGREGATORS)]   # the table's names
    assert all(holds is not None for holds, _, _ in tool.verdicts(cells))   # every claim judged
    assert tool.main(["--runs", str(out), "--docs", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "robustness.csv")))
    assert len(rows) == len(cells) and all(r["seeds"] == str(len(seeds)) and r["test_acc"] for r in rows)
    table = [line for line in (tmp_path / "reproduction.md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(axes["partition"]) * len(axes["attack"])
    assert not any(word in line for line in table for word in ("missing", "refused", "—"))
    assert "mpiexec -n 3 fedmpi sweep jobs/sweeps/robustness.yaml" in capsys.readouterr().out


def test_robustness_shows_missing_and_refused_cells(robustness, tmp_path, capsys):
    tool, s, finished = robustness
    out = tmp_path / "sweep"
    shutil.copytree(finished, out)
    for name in cell_runs(s, partition="iid", attack="none", aggregator="fedavg"):
        shutil.rmtree(out / name)                                    # a cell with no run at all
    shutil.rmtree(out / cell_runs(s, partition="iid", attack="none", aggregator="median")[-1])   # one seed gone
    refuse(out, s, cell_runs(s, partition="dir0.1", attack="alie", aggregator="krum"), "run folder in use")
    assert tool.main(["--runs", str(out), "--docs", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    cells = tool.read_cells(tool.sweep_results.read(SWEEPS / "robustness.yaml", str(out))[1])
    seeds = len(cell_runs(s, partition="iid", attack="none", aggregator="median"))
    assert tool.cell_text(cells, "IID", "no attack", "FedAvg") == "missing"
    assert tool.cell_text(cells, "IID", "no attack", "median").endswith(f"({seeds - 1} of {seeds} seeds)")
    assert tool.cell_text(cells, "Dir(0.1)", "ALIE", "Krum") == "refused"
    assert "- Dir(0.1), ALIE, Krum: refused: run folder in use" in printed.out
    assert "fedmpi sweep jobs/sweeps/robustness.yaml" in printed.err
    judged = {claim: holds for holds, claim, _ in tool.verdicts(cells)}
    assert judged["ALIE evades Krum (Dir(0.1); evades = costs it >= 5 points)"] is None
    assert "| IID | no attack | missing |" in (tmp_path / "reproduction.md").read_text()


def test_robustness_with_no_run_writes_nothing(tmp_path, capsys):
    tool = load_tool("robustness")
    assert tool.main(["--runs", str(tmp_path / "none"), "--docs", str(tmp_path / "docs")]) == 2
    n = len(spec.load(SWEEPS / "robustness.yaml").experiments)
    err = capsys.readouterr().err
    assert f"{n} of {n} experiments have no finished run" in err and "nothing written" in err
    assert not (tmp_path / "docs").exists()
    assert tool.main(["--spec", str(tmp_path / "nowhere.yaml"), "--docs", str(tmp_path / "docs")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "nowhere.yaml" in line and "not found" in line and not (tmp_path / "docs").exists()


def test_personalization_maps_every_experiment_to_one_filled_cell(tmp_path, capsys):
    tool = load_tool("personalization")
    out = tmp_path / "sweep"
    s = fake_sweep(SWEEPS / "personalization.yaml", out, local_eval=True)
    _, results = tool.sweep_results.read(SWEEPS / "personalization.yaml", str(out))
    rows = tool.sweep_table(results)
    want = {(e.labels["split"], tool.METHODS.get(e.labels["method"], e.labels["method"])) for e in s.experiments}
    seeds = len({e.overrides["seed"] for e in s.experiments})
    assert {(r["split"], r["method"]) for r in rows} == want and len(rows) == len(want)
    assert all(r["seeds"] == seeds and np.isfinite(r["local_acc_mean"]) for r in rows)
    # the same cells from the runs' recorded configs alone (--from: split and method label)
    assert {(r["split"], r["method"], r["seeds"]) for r in tool.table_from([str(out)])} == \
        {(r["split"], r["method"], seeds) for r in rows}
    table = tool.markdown(rows).split("| method |")[1].split("\n\n")[0]
    assert "—" not in table.replace("— (never aggregated)", "")        # (local has no global model)
    # one method's runs gone: its row is "—", and the line names the sweep to run
    gone = s.experiments[0].labels["method"]
    for e in s.experiments:
        if e.labels["method"] == gone:
            shutil.rmtree(out / e.name)
    assert tool.main(["--runs", str(out), "--csv", str(tmp_path / "p.csv")]) == 0
    assert "fedmpi sweep jobs/sweeps/personalization.yaml" in capsys.readouterr().err
    rows = list(csv.DictReader(open(tmp_path / "p.csv")))
    assert len(rows) == len(want) - len(tool.SPLITS) and tool.METHODS[gone] not in {r["method"] for r in rows}


PAPERS = sorted(p.stem.removeprefix("repro_") for p in SWEEPS.glob("repro_*.yaml"))


@pytest.mark.parametrize("key", PAPERS)
def test_reproduce_maps_every_experiment_to_one_setting_and_fills_its_section(key, tmp_path, capsys):
    tool = load_tool("reproduce")
    s = fake_sweep(SWEEPS / f"repro_{key}.yaml", tmp_path / "runs" / key)
    docs = tmp_path / "docs"
    assert tool.main(["--paper", key, "--runs", str(tmp_path / "runs"), "--docs", str(docs)]) == 0, \
        capsys.readouterr().err
    settings = {st.config for st in tool.PAPERS[key].settings}
    assert {e.labels["sets"] for e in s.experiments} == settings            # every experiment is a setting
    seeds = len({e.overrides["seed"] for e in s.experiments})
    rows = list(csv.DictReader(open(docs / f"reproduction_{key}.csv")))
    assert len(rows) == len(settings) and all(r["runs"] == str(seeds) for r in rows)
    text = (docs / "reproduction.md").read_text()
    section = text[text.index(f"<!-- paper:{key} -->"):text.index(f"<!-- /paper:{key} -->")]
    assert sum(line.startswith("| ") for line in section.splitlines()) == 2 + len(settings)
    assert f"mpiexec -n 3 fedmpi sweep jobs/sweeps/repro_{key}.yaml" in section
    others = [k for k in tool.ORDER if k != key]
    assert f"Not run yet: `mpiexec -n 3 fedmpi sweep jobs/sweeps/repro_{others[0]}.yaml`" in text


def test_reproduce_names_the_sweep_of_a_setting_without_runs_and_keeps_the_section(tmp_path, capsys):
    tool = load_tool("reproduce")
    s = fake_sweep(SWEEPS / "repro_safl.yaml", tmp_path / "runs" / "safl")
    gone = s.experiments[0].labels["sets"]
    for e in s.experiments:
        if e.labels["sets"] == gone:
            shutil.rmtree(tmp_path / "runs" / "safl" / e.name)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reproduction.md").write_text("OLD\n")
    assert tool.main(["--paper", "safl", "--runs", str(tmp_path / "runs"), "--docs", str(docs)]) == 2
    err = capsys.readouterr().err
    assert f"no finished run of {gone}" in err and "fedmpi sweep jobs/sweeps/repro_safl.yaml" in err
    assert (docs / "reproduction.md").read_text() == "OLD\n"


def test_a_run_of_another_config_in_an_experiments_folder_is_not_taken(tmp_path):
    from fedmpi.sweep import results

    s = fake_sweep(SWEEPS / "repro_safl.yaml", tmp_path)
    victim = s.experiments[1]
    other = next(e for e in s.experiments if e.labels != victim.labels)
    shutil.copy(tmp_path / other.name / "run.h5", tmp_path / victim.name / "run.h5")
    found = {r.experiment.name: r for r in results.read(SWEEPS / "repro_safl.yaml", str(tmp_path))[1]}
    assert found[victim.name].status == "other config" and found[victim.name].run is None
    assert found[other.name].status == "finished"
    assert f"{victim.name}/run.h5 records" in found[victim.name].message
