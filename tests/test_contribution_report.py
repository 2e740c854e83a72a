"""Leave-one-out contributions (fedmpi.analysis.contribution_report, contribution_table) and their section in
`fedmpi report`, on fabricated run files whose test accuracy and loss are set by hand: an original and four
drop-k counterfactuals, one of them still running and one that did not evaluate the last round."""

from __future__ import annotations

import io
import math

import h5py
import numpy as np
import pandas as pd
import pytest
from run_files import base_config, write_run

from fedmpi.analysis.command import report_command
from fedmpi.analysis.contribution_report import client_traits, leave_one_out_frame
from fedmpi.analysis.contribution_table import contribution_table, plot_contributions
from fedmpi.core.errors import InputError

ROUNDS = 6
# Round 5 (1-based) is the last one every finished run evaluated: drop-2 did not evaluate round 6.
ORIGINAL = {"acc": 0.80, "loss": 0.50}
DROPS = {0: {"acc": 0.70, "loss": 0.65}, 1: {"acc": 0.83, "loss": 0.45}, 2: {"acc": 0.78, "loss": 0.52}}
# Hand differences at round 5: accuracy original - without; loss without - original (lower is better).
ACC_VALUE = {0: 0.10, 1: -0.03, 2: 0.02}
LOSS_VALUE = {0: 0.15, 1: -0.05, 2: 0.02}
# Hand-set label counts [client, class]: pooled 20 per class, so the TV distances are 0.5, 0.5, 0, 0, NaN.
LABELS = np.array([[10, 10, 0, 0], [0, 0, 10, 10], [5, 5, 5, 5], [5, 5, 5, 5], [0, 0, 0, 0]])


def _set_metrics(path, acc, loss, unevaluated=()):
    """test_acc and test_loss of every round: `acc`/`loss` at round 5, other values elsewhere, NaN at the
    1-based `unevaluated` rounds."""
    with h5py.File(path, "r+") as f:
        n = len(f["metrics/round"])
        accs = np.linspace(0.3, 0.6, n)
        losses = np.linspace(2.0, 1.0, n)
        if n >= 5:
            accs[4], losses[4] = acc, loss
        for r in unevaluated:
            accs[r - 1] = losses[r - 1] = np.nan
        for name, data in (("test_acc", accs), ("test_loss", losses)):
            del f["metrics"][name]
            f["metrics"][name] = data


def _write_study(root, seed=0, drops=DROPS, name="orig", running=3):
    """An original at ROOT/NAME and its drop-k counterfactuals at ROOT/NAME-drop-k (client `running` still
    being written at round 4), returning the original's folder."""
    original = root / name
    write_run(original / "run.h5", rounds=ROUNDS, config=base_config(original, seed=seed))
    _set_metrics(original / "run.h5", **ORIGINAL)
    with h5py.File(original / "run.h5", "r+") as f:
        del f["partition/labels"], f["partition/samples"]
        f["partition/labels"] = LABELS
        f["partition/samples"] = LABELS.sum(axis=1)
        f.create_group("attack")["malicious"] = np.array([1])
    for client in [*drops, running] if running is not None else list(drops):
        out = root / f"{name}-drop-{client}"
        config = base_config(out, seed=seed, counterfactual={"of": str(original), "drop": [client], "remove": []})
        unfinished = client == running
        write_run(out / "run.h5", rounds=4 if unfinished else ROUNDS, status="running" if unfinished else "finished",
                  config=config, attrs={"counterfactual_of": str(original.resolve()),
                                        "counterfactual_change": f"drop [{client}]"})
        figures = drops.get(client, {"acc": 0.5, "loss": 1.0})
        _set_metrics(out / "run.h5", **figures, unevaluated=(6,) if client == 2 else ())
    return original


@pytest.fixture
def study(tmp_path):
    _write_study(tmp_path / "study")
    return tmp_path / "study"


def test_values_are_the_hand_differences_at_the_common_round_and_the_running_one_is_named(study):
    values = leave_one_out_frame(str(study))
    assert list(values["client"]) == [0, 1, 2]          # client 3's counterfactual is still running
    assert set(values["round"]) == {5}                  # drop-2 did not evaluate round 6
    for _, row in values.iterrows():
        assert row["value"] == pytest.approx(ACC_VALUE[row["client"]])
        assert row["original_value"] == pytest.approx(ORIGINAL["acc"])
        assert row["counterfactual_value"] == pytest.approx(DROPS[row["client"]]["acc"])
        assert row["n"] == 1 and math.isnan(row["value_std"])
        assert row["method"] == "leave-one-out" and row["study"] == "orig"
    assert values.attrs["left_out"] == ["orig-drop-3"]
    assert any("orig-drop-3" in note and "running at round 4" in note for note in values.attrs["notes"])


def test_a_lower_is_better_metric_flips_the_sign(study):
    values = leave_one_out_frame(str(study), metric="test_loss")
    assert dict(zip(values["client"], values["value"])) == pytest.approx(LOSS_VALUE)
    assert "test loss at round 5: without the client - original" in contribution_table(values).caption


def test_at_round_compares_there_and_refuses_a_round_a_run_did_not_measure(study):
    values = leave_one_out_frame(str(study), at_round=4)
    assert set(values["round"]) == {4}
    # at round 4 every run's accuracy is linspace(0.3, 0.6, 6)[3]: no client changes it
    assert np.allclose(values["value"], 0.0)
    with pytest.raises(InputError, match="at_round = 6: orig-drop-2 did not measure test_acc"):
        leave_one_out_frame(str(study), at_round=6)


def test_including_running_runs_uses_them(study):
    values = leave_one_out_frame(str(study), include="running", at_round=4)
    assert list(values["client"]) == [0, 1, 2, 3]


def test_seeds_of_one_study_give_the_mean_and_the_sample_std(tmp_path):
    _write_study(tmp_path / "s", seed=0, name="orig-s0")
    second = {0: {"acc": 0.76, "loss": 0.6}, 1: {"acc": 0.79, "loss": 0.5}}     # values 0.04, 0.01
    _write_study(tmp_path / "s", seed=1, drops=second, name="orig-s1", running=None)
    values = leave_one_out_frame(str(tmp_path / "s"))
    rows = values.set_index("client")
    assert rows.at[0, "value"] == pytest.approx((0.10 + 0.04) / 2)
    assert rows.at[0, "value_std"] == pytest.approx(abs(0.10 - 0.04) / math.sqrt(2))
    assert rows.at[1, "value"] == pytest.approx((-0.03 + 0.01) / 2)
    assert rows.at[0, "n"] == 2 and rows.at[0, "seeds"] == "0,1"
    assert rows.at[2, "n"] == 1 and "n=1 of 2 seeds" in rows.at[2, "note"]      # seed 1 has no drop of 2
    assert set(values["study"]) == {"orig-s0"}


def test_a_counterfactual_that_differs_from_its_original_elsewhere_is_not_used(study):
    out = study / "orig-drop-4"
    config = base_config(out, counterfactual={"of": str(study / "orig"), "drop": [4]}, rounds=9)
    write_run(out / "run.h5", rounds=ROUNDS, config=config)
    values = leave_one_out_frame(str(study))
    assert 4 not in set(values["client"])
    assert any("orig-drop-4: differs from its original in rounds" in n for n in values.attrs["notes"])


def test_client_traits_are_the_label_skew_samples_and_malicious_set(study):
    traits = client_traits(str(study / "orig" / "run.h5"))
    assert list(traits["samples"]) == [20, 20, 20, 20, 0]
    assert traits["label_skew"][:4].tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0])
    assert math.isnan(traits["label_skew"][4])
    assert traits["malicious"].tolist() == [0, 1, 0, 0, 0]


def test_the_table_orders_clients_by_value_and_shows_their_traits(study):
    values = leave_one_out_frame(str(study))
    traits = client_traits(str(study / "orig"))
    table = contribution_table(values, traits)
    assert table.row_labels == ["0", "2", "1"]                   # +10, +2, -3 points
    lines = table.markdown().splitlines()
    assert lines[0] == "| Client | leave-one-out | Samples | Label skew (TV) | Malicious |"
    assert lines[2] == "| 0 | +10.00 | 20 | 0.50 | no |"
    assert lines[4] == "| 1 | -3.00 | 20 | 0.50 | yes |"
    assert "test accuracy at round 5 (percentage points): original - without the client" in table.caption
    assert "\\toprule" in table.latex()
    assert list(table.frame()["client"]) == [0, 2, 1]


def test_the_table_puts_several_methods_side_by_side_and_shows_the_ends(study):
    values = leave_one_out_frame(str(study))
    shapley = values.assign(method="TMC-Shapley", value=[0.01, 0.05, -0.02])
    table = contribution_table(pd.concat([values, shapley]), order_by="TMC-Shapley", ends=1)
    assert table.col_labels == ["leave-one-out", "TMC-Shapley"]
    assert table.row_labels == ["1", "2"]                        # best and worst of TMC-Shapley; 0 hidden
    assert table.notes == ["clients ranked 2 of 3 by value not shown"]
    with pytest.raises(InputError, match="order_by"):
        contribution_table(values, order_by="Shapley (exact)")
    later = contribution_table(pd.concat([values, shapley.assign(round=10)]))
    assert later.col_labels == ["leave-one-out (round 5)", "TMC-Shapley (round 10)"]
    with pytest.raises(InputError, match="several metrics"):
        contribution_table(pd.concat([values, shapley.assign(metric="test_loss")]))


def test_the_figure_draws_bars_ordered_by_value(study, tmp_path):
    values = leave_one_out_frame(str(study))
    traits = client_traits(str(study / "orig"))
    for color_by in ("malicious", "label_skew"):
        path = tmp_path / f"c-{color_by}.png"
        fig = plot_contributions(values, traits, str(path), color_by=color_by)
        assert path.stat().st_size > 0
        ax = fig.axes[0]
        top_down = sorted(ax.patches, key=lambda bar: -bar.get_y())
        assert [bar.get_width() for bar in top_down] == pytest.approx([10.0, 2.0, -3.0])
        ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), key=lambda t: -t[0])
        assert [label for _, label in ticks] == ["0", "2", "1"]
        assert "(pp): original - without the client" in ax.get_xlabel().replace("\n", " ")
    with pytest.raises(InputError, match="color_by"):
        plot_contributions(values, traits, str(tmp_path / "x.png"), color_by="samples")


def test_report_shows_the_section_and_draws_the_figure(study, tmp_path):
    out, err = io.StringIO(), io.StringIO()
    plot = tmp_path / "r.png"
    assert report_command([str(study)], plot=str(plot), out=out, err=err) == 0
    text = out.getvalue()
    section = text[text.index("Client contributions (leave-one-out):"):]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 0", "| 2", "| 1"]
    assert "note: orig-drop-3: running at round 4" in section
    assert (tmp_path / "r-contributions.png").stat().st_size > 0


def test_report_without_counterfactuals_has_no_section(tmp_path):
    write_run(tmp_path / "plain" / "run.h5")
    out = io.StringIO()
    assert report_command([str(tmp_path / "plain")], out=out, err=io.StringIO()) == 0
    assert "Client contributions" not in out.getvalue()


def test_a_runs_frame_and_a_moved_study_folder_give_the_same_values(study, tmp_path):
    import shutil

    from fedmpi.analysis import runs

    moved = tmp_path / "elsewhere" / "study"
    shutil.copytree(study, moved)
    shutil.rmtree(study)            # counterfactual_of now names a folder that is gone: found by name beside it
    values = leave_one_out_frame(runs(str(moved)))
    assert dict(zip(values["client"], values["value"])) == pytest.approx(ACC_VALUE)


def test_two_studies_get_a_table_and_a_figure_each(study, tmp_path):
    other = tmp_path / "other"
    original = other / "prox"
    write_run(original / "run.h5", config=base_config(original, algorithm={"name": "fedprox", "mu": 0.1}))
    _set_metrics(original / "run.h5", **ORIGINAL)
    out = other / "prox-drop-4"
    write_run(out / "run.h5", config=base_config(out, algorithm={"name": "fedprox", "mu": 0.1},
                                                 counterfactual={"of": str(original), "drop": [4]}))
    _set_metrics(out / "run.h5", acc=0.9, loss=0.4, unevaluated=(6,))     # compared at round 5
    values = leave_one_out_frame([str(study), str(other)])
    assert values.groupby("study")["client"].apply(list).to_dict() == {"orig": [0, 1, 2], "prox": [4]}
    with pytest.raises(InputError, match="2 studies"):
        contribution_table(values)
    text, plot = io.StringIO(), tmp_path / "r.png"
    assert report_command([str(study), str(other)], plot=str(plot), out=text, err=io.StringIO()) == 0
    assert "study prox (originals: prox)" in text.getvalue() and "| 4 | -10.00 |" in text.getvalue()
    assert (tmp_path / "r-contributions-orig.png").exists() and (tmp_path / "r-contributions-prox.png").exists()


def test_an_unfinished_original_leaves_its_study_out_and_says_so(study):
    with h5py.File(study / "orig" / "run.h5", "r+") as f:
        f.attrs["status"] = "failed"
    values = leave_one_out_frame(str(study))
    assert len(values) == 0
    assert "orig: failed: the original and its 4 counterfactual(s) left out" in values.attrs["notes"]
    out = io.StringIO()
    assert report_command([str(study)], out=out, err=io.StringIO()) == 0
    assert "no study has a finished original with a finished single-client drop" in out.getvalue()
