"""Issue 40 on real runs: a folder mixing every family (FedAvg over two seeds, FedAvg+FT, q-FFL, a backdoor against
the median, DP-FedAvg, secure aggregation with its clear-text twin, dropouts), made in the shared -n 3 launch
(tests/session_runs.py), read through fedmpi.analysis and `fedmpi report`; docs/how-to/analysis.md's walk-through run as
it is on that folder; eval.max_samples at -n 3 and -n 1 (the same figures).
"""

from __future__ import annotations

import csv
import math
import shlex
import warnings

import doc_blocks
import h5py
import numpy as np
import pytest
import session_runs
from conftest import ROOT, read_metrics, small_config, write_config

import fedmpi.analysis as a
from fedmpi.analysis import figures
from fedmpi.cli import main

pytestmark = pytest.mark.mpi

R = 2
LOCAL = {"every": 1, "local_every": R, "local_clients": "all"}
CLIP = 0.01                 # every update of the lr model is longer: secure aggregation clips them all
FAMILIES = {
    "fedavg-s0": {"seed": 0, "eval": LOCAL},
    "fedavg-s1": {"seed": 1, "eval": LOCAL},
    "fedavg_ft-s0": {"seed": 0, "eval": {**LOCAL, "finetune_steps": 5}},
    "fedavg_ft-s1": {"seed": 1, "eval": {**LOCAL, "finetune_steps": 5}},
    "qffl-s0": {"seed": 0, "eval": LOCAL, "algorithm": {"name": "qffl", "q": 1.0}},
    "backdoor-s0": {"seed": 0, "attack": {"name": "backdoor", "fraction": 0.25, "target": 0},
                    "server": {"clients_per_round": 6, "aggregator": "median"}},
    "dp-s0": {"seed": 0, "privacy": {"mechanism": "gaussian", "clip": 0.5, "noise_multiplier": 0.5, "delta": 1e-3}},
    "secagg-s0": {"seed": 0, "server": {"clients_per_round": 6, "secure_aggregation": "secagg"},
                  "secagg": {"clip": CLIP}},
    "twin-s0": {"seed": 0, "server": {"clients_per_round": 6},
                "privacy": {"mechanism": "gaussian", "clip": CLIP, "noise_multiplier": 0}},
    "dropout-s0": {"seed": 0, "clients": {"dropout": 0.3}},
}
SUBSAMPLE = {"eval": {"every": 1, "max_samples": 300}}


@session_runs.plan
def family_runs(base):
    steps = {3: [], 1: []}
    for name, sections in FAMILIES.items():
        cfg = small_config(base / "paper" / name, rounds=R, partition={"clients": 12, "scheme": "dirichlet",
                                                                        "beta": 0.5, "local_test": 0.2},
                           **sections)
        steps[3].append(["run", write_config(base / f"{name}.yaml", cfg)])
    for n in (3, 1):
        cfg = small_config(base / "subsample" / f"n{n}", rounds=R, **SUBSAMPLE)
        steps[n].append(["run", write_config(base / f"subsample-n{n}.yaml", cfg)])
    return steps, base


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, family_runs)


def test_summary_of_a_folder_mixing_every_family(runs):
    """The issue's "Done when": runs('RUNS/*') and summary(df, by=['algorithm.name']) give mean, std and n per
    method, every family's figures present where a run has them."""
    df = a.runs(str(runs / "paper" / "*"))
    assert sorted(df["run"]) == sorted(FAMILIES) and set(df["status"]) == {"finished"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the fedavg group mixes runs (the next test)
        summary = a.summary(df, by=["algorithm.name"])
    assert list(summary["algorithm.name"]) == ["fedavg", "qffl"]
    assert {"final_acc_mean", "final_acc_std", "n"} <= set(summary.columns)
    assert list(summary["n"]) == [len(FAMILIES) - 1, 1]
    fedavg = df[df["algorithm.name"] == "fedavg"]["final_acc"]
    assert summary["final_acc_mean"][0] == pytest.approx(fedavg.mean())
    assert summary["final_acc_std"][0] == pytest.approx(fedavg.std(ddof=1))
    present = {f.family for f in figures.FIGURES for v in df[f.name] if np.isfinite(v)}
    assert present == set(figures.FAMILIES), set(figures.FAMILIES) - present
    row = df.set_index("run").loc
    for name in FAMILIES:                   # honest names: final_acc is the last evaluated accuracy
        metrics, _ = read_metrics(runs / "paper" / name)
        acc = metrics["test_acc"][np.isfinite(metrics["test_acc"])]
        assert row[name, "final_acc"] == acc[-1] and row[name, "acc_last20_mean"] == pytest.approx(acc.mean())
        assert row[name, "rounds_done"] == R


def test_fedavg_with_fine_tuning_is_never_merged_with_fedavg(runs, capsys):
    df = a.runs(str(runs / "paper"))
    labels = dict(zip(df["run"], df["method"]))
    assert labels["fedavg-s0"] == "fedavg" and labels["fedavg_ft-s0"] == "fedavg+ft5"
    assert labels["backdoor-s0"] == "fedavg+median vs backdoor" and labels["dp-s0"] == "fedavg+dp"
    assert labels["secagg-s0"] == "fedavg+secagg" and labels["twin-s0"] == f"fedavg+clip{CLIP:g}"
    # Only the seeds share a label, and the run with dropouts: the same method in another deployment (a summary
    # by method names what differs in its `varies`).
    assert len(set(labels.values())) == len(FAMILIES) - 3 and labels["dropout-s0"] == "fedavg"
    plain = a.summary(df[df["method"] == "fedavg"], warn=False)
    assert plain["varies"][0] == "clients.dropout,eval.local_every,eval.local_clients,partition.local_test" or \
        "clients.dropout" in plain["varies"][0]
    summary = a.summary(df[df["run"].str.startswith("fedavg")])    # by method
    assert list(summary["method"]) == ["fedavg", "fedavg+ft5"] and list(summary["n"]) == [2, 2]
    assert list(summary["seed"]) == ["0,1", "0,1"] and list(summary["varies"]) == ["", ""]
    with pytest.warns(UserWarning, match="eval.finetune_steps"):
        mixed = a.summary(df[df["run"].str.startswith("fedavg")], by=["algorithm.name"])
    assert mixed["varies"][0] == "eval.finetune_steps"
    # The fine-tuned clients score differently on their own splits: a merged group would show a spread.
    local = df.set_index("run")["local_acc_mean"]
    assert all(local[f"fedavg_ft-s{s}"] != local[f"fedavg-s{s}"] for s in (0, 1))
    assert main(["report", str(runs / "paper"), "--by", "algorithm"]) == 0
    out = capsys.readouterr().out
    assert "note: the group algorithm=fedavg mixes runs that differ in " in out and "--by method" in out


def test_personalization_and_every_family_in_the_csv_and_the_default_table(runs, tmp_path, capsys):
    assert main(["report", str(runs / "paper"), "--csv", str(tmp_path / "t.csv"), "--clients"]) == 0
    out = capsys.readouterr().out
    for family in figures.FAMILIES[2:]:
        assert f"\n{family}:\n" in out, family
    rows = {r["run"]: r for r in csv.DictReader(open(tmp_path / "t.csv"))}
    assert set(rows) == set(FAMILIES)
    for name in ("local_acc_mean", "local_acc_worst10", "local_acc_std", "local_below_global_n", "backdoor_acc",
                 "epsilon", "secagg_clipped_fraction", "sim_time_s", "dropouts"):
        assert name in rows["fedavg-s0"], name
    assert 0 < float(rows["fedavg_ft-s0"]["local_acc_mean"]) <= 1 and rows["dp-s0"]["local_acc_mean"] == ""
    below = int(rows["fedavg-s0"]["local_below_global_n"])
    assert 0 <= below <= 12
    clients = list(csv.DictReader(open(tmp_path / "t-clients.csv")))
    assert {r["run"] for r in clients} == {"fedavg-s0", "fedavg-s1", "fedavg_ft-s0", "fedavg_ft-s1", "qffl-s0"}
    assert {r["round"] for r in clients} == {str(R)}               # 1-based: the last of R rounds


def test_secure_aggregation_warns_when_it_clips_and_its_clear_text_twin_compares(runs):
    _, attrs = read_metrics(runs / "paper" / "secagg-s0")
    assert attrs["secagg_clip_warning"] == (f"more than half of the updates clipped to secagg.clip = {CLIP:g} in "
                                            f"{R} round(s): {', '.join(map(str, range(1, R + 1)))}")
    secure, _ = read_metrics(runs / "paper" / "secagg-s0")
    twin, twin_attrs = read_metrics(runs / "paper" / "twin-s0")
    assert twin_attrs["status"] == "finished" and "secagg_clip_warning" not in twin_attrs
    # The same updates from the same model in round 1: clipped alike; later the secure run's integers differ.
    assert secure["secagg_clipped_fraction"][0] == twin["dp_clipped_fraction"][0] == 1.0
    assert abs(secure["test_acc"][-1] - twin["test_acc"][-1]) < 0.05
    df = a.runs([str(runs / "paper" / n) for n in ("secagg-s0", "twin-s0")]).set_index("run")
    assert df.loc["secagg-s0", "secagg_rounds_half_clipped"] == R and math.isinf(df.loc["twin-s0", "epsilon"])
    # the protocol's messages in bytes_moved: uploads carry the keys and shares sent, downloads those received
    extra_down = secure["secagg_extra_down_bytes"] * secure["secagg_survivors"]
    assert np.all(secure["bytes_down"] >= twin["bytes_down"] + np.floor(extra_down))


def test_max_samples_gives_the_same_figures_at_every_rank_count(runs):
    m3, attrs3 = read_metrics(runs / "subsample" / "n3")
    m1, attrs1 = read_metrics(runs / "subsample" / "n1")
    assert attrs3["world_size"] == 3 and attrs1["world_size"] == 1
    for name in ("test_acc", "test_loss", "model_sha256"):
        assert list(m3[name]) == list(m1[name]), name
    with h5py.File(runs / "subsample" / "n3" / "run.h5", "r") as f3, \
            h5py.File(runs / "subsample" / "n1" / "run.h5", "r") as f1:
        assert len(f3["eval/test_indices"]) == 300
        np.testing.assert_array_equal(f3["eval/test_indices"][()], f1["eval/test_indices"][()])


def walk_through():
    """docs/how-to/analysis.md's code blocks, in order (tests/doc_blocks.py reads them): ("bash", command lines)
    and ("python", source)."""
    return [(b.lang, b.text) for b in doc_blocks.blocks(ROOT / "docs" / "how-to" / "analysis.md")
            if b.lang in ("bash", "python")]


def test_the_walk_through_of_docs_analysis_runs_as_written(runs, tmp_path, monkeypatch, capsys):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "paper").symlink_to(runs / "paper")
    monkeypatch.chdir(tmp_path)
    blocks = walk_through()
    assert [kind for kind, _ in blocks].count("python") >= 4
    namespace = {}
    for kind, text in blocks:
        if kind == "bash":
            for line in text.strip().splitlines():
                args = shlex.split(line)
                assert args[0] == "fedmpi" and main(args[1:]) == 0, line
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(text, "docs/how-to/analysis.md", "exec"), namespace)   # noqa: S102 - the doc's own code
    out = capsys.readouterr().out
    assert "\\begin{tabular}" in out and "fedavg+ft5" in out and "| method |" in out
    for name in ("paper-table.csv", "paper.png", "paper-python.png"):
        assert (tmp_path / "runs" / name).stat().st_size > 0, name
    summary = namespace["summary"]
    assert set(summary["method"]) == set(a.runs("runs/paper")["method"])
