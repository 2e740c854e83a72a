"""tools/contribution_study.py and tools/unlearning_study.py end to end on a 3-client case: the original (its updates
recorded), every subset by `fedmpi counterfactual --subsets all` in this process, then the study's table. The
exact values add up to v(N) - v(empty) and leave-one-out is the runs' differences, both read back from the runs
themselves; GTG-Shapley from the recorded updates is in the table; a missing subset refuses the study."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pandas as pd
import pytest
from conftest import small_config, tool_module, write_config

from fedmpi.cli import main

study = tool_module("contribution_study")
CLIENTS = 3


@pytest.fixture(scope="module")
def game(tmp_path_factory):
    base = tmp_path_factory.mktemp("game")
    cfg = small_config(base / "orig", rounds=2, partition={"clients": CLIENTS, "scheme": "dirichlet", "beta": 0.5},
                       client={"lr": 0.05, "batch_size": 20, "steps": 4}, server={"clients_per_round": CLIENTS},
                       attack={"name": "label_flip", "clients": [1]}, eval={"every": 1},
                       checkpoint={"every": 1, "updates": True}, runtime={"threads": 1, "progress": "off"})
    assert main(["run", str(write_config(base / "orig.yaml", cfg))]) == 0
    assert main(["counterfactual", str(base / "orig"), "--out", str(base / "subsets"), "--subsets", "all"]) == 0
    assert not list((base / "subsets").glob("*/updates"))          # the original's recording is not inherited
    return base


def _final_acc(folder):
    with h5py.File(folder / "run.h5", "r", locking=False) as f:
        return float(f["metrics/test_acc"][-1])


def test_the_table_holds_what_the_runs_say(game, tmp_path, capsys):
    out = tmp_path / "study"
    assert study.main([str(game / "orig"), str(game / "subsets"), "--out", str(out), "--tmc", "4",
                       "--tmc-seeds", "2"]) == 0
    values = pd.read_csv(out / "contribution.csv")
    exact = values[values["method"] == "Shapley (exact, enumeration)"].set_index("client")["value"]
    full, empty = _final_acc(game / "orig"), _final_acc(game / "subsets" / "keep-none")
    assert exact.sum() == pytest.approx(full - empty, abs=1e-5)            # efficiency, on the runs' own values
    loo = values[values["method"] == "Leave-one-out"].set_index("client")["value"]
    for c in range(CLIENTS):
        rest = ".".join(str(i) for i in range(CLIENTS) if i != c)
        assert loo[c] == pytest.approx(full - _final_acc(game / "subsets" / f"keep-{rest}"), abs=1e-5)
    assert set(values["method"]) >= {"TMC-Shapley (4 permutations)", "GTG-Shapley (recorded updates)"}
    assert values.loc[values["client"] == 1, "malicious"].eq(1).all()
    text = (out / "contribution.md").read_text()
    assert "| 4 permutations | 2 |" in text and (out / "contribution.png").stat().st_size > 0


def test_a_missing_subset_refuses_the_study(game, tmp_path, capsys):
    partial = tmp_path / "partial"
    shutil.copytree(game / "subsets", partial)
    shutil.rmtree(partial / "keep-0")
    assert study.main([str(game / "orig"), str(partial), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 of the 8 subsets have no run" in err[0]
    assert not (tmp_path / "s").exists()


def test_the_unlearning_table_measures_fedeaser_against_the_exact_retrain(game, tmp_path, capsys):
    unlearning = tool_module("unlearning_study")
    out = tmp_path / "unlearn"
    assert unlearning.main([str(game / "orig"), "--forget", "0", "--every", "1,2", "--np", "1", "--out", str(out)]) == 0
    rows = pd.read_csv(out / "unlearning.csv").set_index("model")
    assert rows.loc["exact retrain without the client", "distance_to_retrain"] == 0
    assert rows.loc["original (not unlearned)", "distance_to_retrain"] > 0
    assert list(rows.index[2:]) == ["FedEraser (every 1, 0.5 of the steps)", "FedEraser (every 2, 0.5 of the steps)"]
    assert rows.loc["FedEraser (every 2, 0.5 of the steps)", "cost"] == "1 round, 4 local steps"
    with h5py.File(out / "runs" / "retrain" / "run.h5", "r", locking=False) as f:
        assert f.attrs["counterfactual_change"] == "drop [0]"


def test_fedeaser_replaying_every_round_with_the_same_steps_and_nobody_forgotten_is_the_original(game, tmp_path):
    # Each calibrated update is then the update itself rescaled to its own norm: the replay is the original up to
    # float32 rounding of start + (vector - start).
    out = tmp_path / "replay"
    assert main(["run", str(game / "orig.yaml"), f"out={out}", "unlearning.method=federaser",
                 f"unlearning.original={game / 'orig'}", "unlearning.every=1"]) == 0
    with h5py.File(game / "orig" / "run.h5", "r", locking=False) as a, h5py.File(out / "run.h5", "r",
                                                                                   locking=False) as b:
        assert np.array_equal(a["metrics/test_acc"][()], b["metrics/test_acc"][()])
        assert np.abs(a["model/global"][()] - b["model/global"][()]).max() < 1e-6
