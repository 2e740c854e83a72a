"""fedmpi.analysis as a Python API (issue 40) on run files written in the run log's layout (tests/run_files.py):
the statistics of `summary` against hand-computed cases, `rounds` tidy and 1-based, every figure defined once
(the doc's table and `fedmpi report --help` say the same), method labels generated over the options that make a
method different, the paper tables, and the trial's cases that need no MPI run."""

from __future__ import annotations

import csv
import math

import h5py
import matplotlib.image
import numpy as np
import pytest
import yaml
from conftest import ROOT
from run_files import base_config, write_run

import fedmpi.analysis as a
from fedmpi.analysis import figures, frames, labels
from fedmpi.cli import main


def with_local_eval(path, rounds, acc_last=(0.5, 0.7, 0.9, 0.2)):
    """Adds a local evaluation at the last round: /metrics/local_* and /clients/local_acc (dense layout)."""
    acc = np.array(acc_last)
    with h5py.File(path, "a") as f:
        for name, value in (("local_acc_mean", 0.6), ("local_acc_worst10", 0.2), ("local_acc_std", acc.std()),
                            ("local_acc_unweighted", acc.mean()), ("local_acc_worst", acc.min()),
                            ("local_below_global", 0.5)):
            column = np.full(rounds, np.nan)
            column[-1] = value
            f["metrics"][name] = column
        table = np.full((rounds, 5), np.nan, dtype=np.float32)
        table[-1, :len(acc)] = acc
        f.require_group("clients")["local_acc"] = table
    return path


def test_final_acc_is_the_last_evaluation_and_the_mean_is_named_for_its_window(tmp_path):
    """The trial: a 3-round run's final_acc was the mean of its 3 evaluations, not its last accuracy."""
    path = write_run(tmp_path / "r" / "run.h5", rounds=3)
    with h5py.File(path, "r") as f:
        acc = f["metrics/test_acc"][()]
    [row] = a.runs(str(path)).to_dict("records")
    assert row["final_acc"] == acc[-1] and row["acc_last20_mean"] == pytest.approx(acc.mean())
    assert row["final_acc"] != pytest.approx(row["acc_last20_mean"])
    evaluated_every_second = write_run(tmp_path / "s" / "run.h5", rounds=6, eval_every=4)
    [row] = a.runs(str(evaluated_every_second)).to_dict("records")
    with h5py.File(evaluated_every_second, "r") as f:
        assert row["final_acc"] == f["metrics/test_acc"][3]      # the one evaluation: round 4 of 6


def test_summary_is_mean_std_n_and_a_t_interval_over_seeds(tmp_path):
    for seed in (0, 1, 2):
        write_run(tmp_path / f"s{seed}" / "run.h5", config=base_config(tmp_path / f"s{seed}", seed=seed))
    df = a.runs(str(tmp_path))
    df["final_acc"] = [0.5, 0.6, 0.8]                     # hand-computed: mean 0.6333, std 0.1528
    [row] = a.summary(df, by=["method"]).to_dict("records")
    assert row["n"] == 3 and row["seed"] == "0,1,2" and row["varies"] == ""
    assert row["final_acc_mean"] == pytest.approx(0.633333333)
    assert row["final_acc_std"] == pytest.approx(0.152752523)
    assert row["final_acc_ci95"] == pytest.approx(4.3027 * 0.152752523 / math.sqrt(3), rel=1e-4)
    one = a.summary(df.iloc[:1]).to_dict("records")[0]
    assert one["n"] == 1 and math.isnan(one["final_acc_std"]) and math.isnan(one["final_acc_ci95"])


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for dof in range(1, 301):
        assert frames.t_quantile(dof) == pytest.approx(stats.t.ppf(0.975, dof), abs=2e-4), dof


def test_rounds_is_tidy_1_based_and_leaves_out_what_was_not_measured(tmp_path):
    path = write_run(tmp_path / "r" / "run.h5", rounds=6, eval_every=2)
    with h5py.File(path, "r") as f:
        acc = f["metrics/test_acc"][()]
        cosine = f["clients/update_cosine"][()]
        class_acc = f["metrics/class_acc"][()]
    tidy = a.rounds(str(path), metrics=["test_acc", "class_acc"])
    assert list(tidy.columns) == ["run", "round", "metric", "value"]
    accs = tidy[tidy["metric"] == "test_acc"]
    assert list(accs["round"]) == [2, 4, 6]                  # evaluated every second round, 1-based
    np.testing.assert_array_equal(accs["value"], acc[1::2])
    assert set(tidy["metric"]) == {"test_acc"} | {f"class_acc/{k}" for k in range(4)}
    clients = a.rounds(str(path), per="client", metrics=["update_cosine"])
    assert list(clients.columns) == ["run", "round", "client", "metric", "value"]
    assert len(clients) == np.isfinite(cosine).sum() and clients["round"].min() == 1
    first = clients[clients["round"] == 1].set_index("client")["value"]
    for k, value in first.items():
        assert value == pytest.approx(cosine[0, k])
    classes = a.rounds(str(path), per="class")
    assert len(classes) == np.isfinite(class_acc).sum() and set(classes["class"]) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="per"):
        a.rounds(str(path), per="rank")


# Every option that makes a different method, with the label part it must add (labels' module docstring).
OPTIONS = {
    "eval.finetune_steps": (10, "+ft10"), "server.optimizer": ("adam", "+adam"),
    "server.aggregator": ("krum", "+krum"), "server.weighting": ("uniform", "+uniform"),
    "privacy.mechanism": ("gaussian", "+dp"), "server.secure_aggregation": ("secagg", "+secagg"),
    "secagg.weighting": ("samples", "+weighted"),
    "attack.name": ("label_flip", " vs label_flip"),
}


def _set(config, dotted, value):
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


@pytest.mark.parametrize("key", list(OPTIONS))
def test_each_option_that_makes_another_method_is_in_its_label(key):
    config = base_config("unused")
    value, part = OPTIONS[key]
    _set(config, key, value)
    assert labels.method_label(config) == "fedavg" + part
    assert labels.method_label(base_config("unused")) == "fedavg"


def test_the_clear_text_twin_of_secure_aggregation_is_labelled_by_its_clip():
    config = base_config("unused", privacy={"mechanism": "gaussian", "clip": 0.5, "noise_multiplier": 0})
    assert labels.method_label(config) == "fedavg+clip0.5"
    config["privacy"]["target_epsilon"] = 8.0           # then the noise is calibrated: a DP run
    assert labels.method_label(config) == "fedavg+dp"


def test_every_figure_is_defined_in_the_doc_and_the_report_help(capsys):
    doc = (ROOT / "docs" / "how-to" / "analysis.md").read_text()
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    for figure in figures.FIGURES + figures.TARGET_FIGURES:
        assert f"| `{figure.name}` | {figure.family} | {figure.definition} |" in doc, figure.name
        assert f"{figure.name}: {figure.definition}" in helped, figure.name


def test_each_family_appears_in_the_table_the_csv_and_the_summary_where_recorded(tmp_path, capsys):
    plain = write_run(tmp_path / "runs" / "plain" / "run.h5", instruments=False)
    local = with_local_eval(write_run(tmp_path / "runs" / "local" / "run.h5", instruments=False), 6)
    assert main(["report", str(tmp_path / "runs"), "--csv", str(tmp_path / "t.csv")]) == 0
    out = capsys.readouterr().out
    assert "\npersonalization:\n" in out and "\nfairness:\n" in out and "\nprivacy:" not in out
    rows = {r["run"]: r for r in csv.DictReader(open(tmp_path / "t.csv"))}
    assert rows["local"]["local_acc_mean"] == "0.6" and rows["plain"]["local_acc_mean"] == ""
    assert rows["local"]["local_below_global_n"] == "2"          # half of the 4 clients evaluated
    assert rows["local"]["rounds_done"] == "6"                   # counts as integers
    summary = a.summary(a.runs([str(plain), str(local)]), by=["run"])
    assert summary.set_index("run").loc["local", "local_acc_worst_mean"] == pytest.approx(0.2)


def test_csv_writes_each_view_asked_for_beside_the_table(tmp_path, capsys):
    run = with_local_eval(write_run(tmp_path / "runs" / "r" / "run.h5"), 6)
    assert main(["report", str(run), "--csv", str(tmp_path / "t.csv"), "--clients", "--attack", "--timing",
                 "--classes"]) == 0
    for view in ("clients", "attack", "timing", "classes"):
        assert (tmp_path / f"t-{view}.csv").stat().st_size > 0, view
    [clients] = list(csv.DictReader(open(tmp_path / "t-clients.csv")))
    assert clients["round"] == "6" and clients["clients"] == "4.0"        # 1-based: the sixth round
    assert len(list(csv.DictReader(open(tmp_path / "t-classes.csv")))) == 4
    # a view's file is checked with the table's before anything is written: an existing one needs --force
    (tmp_path / "u-clients.csv").write_text("keep")
    capsys.readouterr()
    assert main(["report", str(run), "--csv", str(tmp_path / "u.csv"), "--clients"]) == 2
    assert str(tmp_path / "u-clients.csv") in capsys.readouterr().err
    assert not (tmp_path / "u.csv").exists() and (tmp_path / "u-clients.csv").read_text() == "keep"
    assert main(["report", str(run), "--csv", str(tmp_path / "u.csv"), "--clients", "--force"]) == 0
    assert (tmp_path / "u-clients.csv").read_text() != "keep"


def test_paper_tables_in_markdown_and_latex(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path / f"s{seed}" / "run.h5", config=base_config(tmp_path / f"s{seed}", seed=seed,
                                                                       eval={"finetune_steps": 3}))
    summary = a.summary(a.runs(str(tmp_path)))
    markdown = a.table(summary, "markdown", ["final_acc", "bytes_moved"]).splitlines()
    assert markdown[0] == "| method | n | round | seed | final_acc (%, mean ± std) | bytes_moved (MB, mean ± std) |"
    mean, std = summary["final_acc_mean"][0], summary["final_acc_std"][0]
    assert markdown[2] == (f"| fedavg+ft3 | 2 | 6 | 0,1 | {100 * mean:.3f} ± {100 * std:.3f} | 0.011 ± 0.000 |")
    latex = a.table(summary, "latex", ["final_acc"])
    assert latex.startswith("\\begin{tabular}{llllr}") and "final\\_acc (\\%, mean $\\pm$ std)" in latex
    assert latex.rstrip().endswith("\\end{tabular}")
    with pytest.raises(ValueError, match="markdown or latex"):
        a.table(summary, "html")


def test_report_prints_a_grouped_summary_as_latex(tmp_path, capsys):
    for seed in (0, 1):
        write_run(tmp_path / f"s{seed}" / "run.h5", config=base_config(tmp_path / f"s{seed}", seed=seed))
    assert main(["report", str(tmp_path), "--by", "method", "--format", "latex"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("\\begin{tabular}{llr") and lines[2].startswith("method & n & seeds & emd")
    assert lines[4].startswith("fedavg & 2 & 0,1 & ") and "$\\pm$" in lines[4] and lines[-3] == "\\end{tabular}"
    assert any(line.startswith("% note: every group is compared at round 6") for line in lines)
    assert any(line.startswith("% note: each grouped cell is mean ± std (sample standard deviation, n - 1)")
               for line in lines)
    assert all(line.startswith(("\\", "%")) or "&" in line for line in lines if line)     # nothing LaTeX chokes on


def test_the_per_run_figure_of_an_attack_run_has_a_backdoor_panel(tmp_path, capsys):
    attacked = write_run(tmp_path / "runs" / "attacked" / "run.h5", instruments=False)
    write_run(tmp_path / "runs" / "clean" / "run.h5", instruments=False)
    with h5py.File(attacked, "a") as f:
        f["metrics"]["backdoor_acc"] = np.linspace(0.1, 0.6, 6)
        f.attrs["config"] = yaml.safe_dump(base_config(tmp_path, attack={"name": "backdoor"}))
    assert main(["report", str(tmp_path / "runs"), "--plot", str(tmp_path / "f.png"), "--per-run"]) == 0
    wide, narrow = (matplotlib.image.imread(tmp_path / f"f-{name}.png").shape for name in ("attacked", "clean"))
    assert 1.6 < wide[1] / narrow[1] < 2.4                       # two panels against one


def test_the_personalization_tool_reads_a_users_runs_and_keeps_fine_tuning_apart(tmp_path):
    """The trial: tools/personalization.py could read only its own grid's folder; FedAvg+FT merged with FedAvg."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("tool_personalization_api", ROOT / "tools" / "personalization.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    spec.loader.exec_module(tool)
    shards = {"clients": 5, "scheme": "shards", "shards_per_client": 2}
    for name, steps, seed in (("a", 0, 0), ("b", 0, 1), ("c", 10, 0), ("d", 10, 1)):
        cfg = base_config(tmp_path / "mine" / name, seed=seed, partition=shards,
                          eval={"local_every": 6, "finetune_steps": steps})
        run = with_local_eval(write_run(tmp_path / "mine" / name / "run.h5", config=cfg), 6)
        with h5py.File(run, "a") as f:
            f["metrics/local_acc_mean"][-1] = 0.5 + 0.1 * (steps > 0) + 0.02 * seed
    rows = {(r["split"], r["method"]): r for r in tool.table_from([str(tmp_path / "mine")])}
    assert set(rows) == {("shards2", "FedAvg"), ("shards2", "FedAvg+FT")}
    assert rows["shards2", "FedAvg"]["local_acc_mean"] == pytest.approx(0.51)
    assert rows["shards2", "FedAvg+FT"]["local_acc_mean"] == pytest.approx(0.61)
    assert rows["shards2", "FedAvg+FT"]["seeds"] == 2
    assert tool.verdict(list(rows.values()), "shards2", "FedAvg+FT")[0] == "holds"
    assert tool.verdict(list(rows.values()), "shards2", "Ditto")[0] == "not run"


def test_summary_and_table_of_a_glob_that_matched_nothing_say_no_run_was_found(tmp_path):
    """H13: summary or table over runs() of a glob that matched nothing raised a KeyError naming the columns
    'method, seed' as missing and listing none, instead of saying that no run was found."""
    pattern = str(tmp_path / "nothing" / "*")
    df = a.runs(pattern)
    assert len(df) == 0
    for call in (lambda: a.summary(df), lambda: a.table(a.summary(df)), lambda: a.table(df)):
        with pytest.raises(ValueError, match="no run was found") as caught:
            call()
        assert repr(pattern) in str(caught.value)
