"""Every privacy figure that `fedmpi report` (its table and CSV) and `fedmpi.analysis.runs()` give is the run
file's whole-model guarantee, for every mechanism with an accountant: client-level DP (privacy.mechanism) and
secure aggregation's distributed noise (secagg.noise), each taken from its config section's registry of choices.
H03: a fork that turned the noise on part-way records privacy_epsilon = inf (with its note) in run.h5, while the
report and the API printed the last /metrics/epsilon, which counts the noised rounds only."""

from __future__ import annotations

import csv
import math
import typing

import h5py
import pytest
from conftest import small_config, write_config

from fedmpi.analysis import frames
from fedmpi.cli import main
from fedmpi.privacy.keys import PrivacyConfig
from fedmpi.secagg.keys import SecAggConfig

BASE = {"rounds": 4, "data": {"name": "synthetic"}, "partition": {"clients": 8, "scheme": "iid"},
        "server": {"clients_per_round": 4}, "checkpoint": {"every": 2, "keep": 5}}
FORK_ROUND = 2


def _choices(config_cls, key):
    hints = typing.get_type_hints(config_cls)
    return [value for value in typing.get_args(hints[key]) if value != "none"]


def _sections(prefix, choice):
    if prefix == "privacy":
        return {"privacy": {"mechanism": choice, "noise_multiplier": 1.0, "clip": 1.0, "delta": 1e-3}}
    return {"server": {"clients_per_round": 4, "secure_aggregation": "secagg"},
            "secagg": {"bits": 40, "clip": 2.0, "scale": 100000.0, "noise": choice, "noise_multiplier": 0.5,
                       "delta": 0.01}}


# Every mechanism with an accountant: (the run attributes' prefix, the registry's choice).
MECHANISMS = [("privacy", m) for m in _choices(PrivacyConfig, "mechanism")] + \
             [("secagg", n) for n in _choices(SecAggConfig, "noise")]


def test_the_mechanisms_come_from_the_registries():
    assert ("privacy", "gaussian") in MECHANISMS and {"skellam", "discrete_gaussian"} <= {n for _, n in MECHANISMS}


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """One parent run without any mechanism, checkpointed at FORK_ROUND, for every fork."""
    pytest.importorskip("dp_accounting")
    from fuzz_harness import release_claims

    folder = tmp_path_factory.mktemp("parent")
    try:
        assert main(["run", str(write_config(folder / "parent.yaml", small_config(folder / "out", **BASE)))]) == 0
    finally:
        release_claims()
    return folder / "out"


def _attrs(out):
    with h5py.File(out / "run.h5", "r", locking=False) as f:
        return dict(f.attrs), f["metrics/epsilon"][()]


def _reported(out, tmp_path, capsys):
    """(the report's CSV row, its printed table, the API's row) of one run."""
    capsys.readouterr()
    assert main(["report", str(out), "--csv", str(tmp_path / "t.csv")]) == 0
    printed = capsys.readouterr().out
    with open(tmp_path / "t.csv", newline="") as fh:
        [row] = list(csv.DictReader(fh))
    [api] = frames.runs(str(out)).to_dict("records")
    return row, printed, api


@pytest.mark.parametrize("prefix, choice", MECHANISMS, ids=[f"{p}-{c}" for p, c in MECHANISMS])
@pytest.mark.parametrize("forked", [False, True], ids=["fresh", "fork-turns-it-on"])
def test_report_csv_and_api_give_the_run_files_epsilon(parent, tmp_path, capsys, prefix, choice, forked):
    from fuzz_harness import release_claims

    cfg = small_config(tmp_path / "out", **{**BASE, **_sections(prefix, choice)})
    args = ["run", str(write_config(tmp_path / "c.yaml", cfg))]
    try:
        assert main(args + (["--fork-from", f"{parent}@{FORK_ROUND}"] if forked else [])) == 0
    finally:
        release_claims()
    attrs, per_round = _attrs(tmp_path / "out")
    whole = float(attrs[f"{prefix}_epsilon"])
    noised = float(attrs.get(f"{prefix}_epsilon_rounds", whole))
    if forked:
        assert whole == math.inf and f"{prefix}_epsilon_note" in attrs
        assert noised == per_round[-1] and math.isfinite(noised)     # the noised rounds' own, under its name
    else:
        assert math.isfinite(whole) and whole == per_round[-1] == noised
    row, printed, api = _reported(tmp_path / "out", tmp_path, capsys)
    for source in (row, api):
        assert float(source["epsilon"]) == whole, (source["epsilon"], whole)
        assert float(source["noised_rounds_epsilon"]) == pytest.approx(noised, rel=1e-12)
    privacy = printed.split("privacy:\n", 1)[1].splitlines()
    header, line = privacy[0].split(), privacy[2].split()
    shown = line[header.index("epsilon")]
    assert (shown == "inf") if forked else float(shown) == pytest.approx(whole, rel=1e-3), privacy
    note = attrs.get(f"{prefix}_epsilon_note")
    assert api["epsilon_note"] == note and (row.get("epsilon_note") or None) == note
    assert (f"note: out: {note}" in printed) == forked
    summary = frames.summary(frames.runs(str(tmp_path / "out")))
    assert summary.loc[0, "epsilon_mean"] == whole and summary.loc[0, "epsilon_n"] == 1
