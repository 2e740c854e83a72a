"""tools/reproduce.py's three-valued verdicts (issue 52): holds, does not hold, or not decided at this scale
with the measured cause, decided from the spread over the seeds and the slope over the last evaluations, never
from a row's place in a table. The rows come from fabricated runs (tests/run_files.py, whose test accuracy is
replaced by a chosen curve per seed) through the script's own table_rows."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import tool_module
from run_files import base_config, write_run

from fedmpi.analysis import report

ROUNDS = 30


def load_tool(name):
    return tool_module(name, "verdicts")


@pytest.fixture(scope="module")
def repro():
    return load_tool("reproduce")


def flat(level, seed):
    """A curve that reached `level` (plus a per-seed offset of 0.2 points) by round 5 and stays there."""
    acc = np.full(ROUNDS, level + 0.002 * (seed - 1))
    acc[:5] = np.linspace(0.1, acc[5], 5)
    return acc


def rising(end, seed):
    """A curve still climbing steeply at its last evaluations (2 points a round) up to `end`."""
    return np.clip(end + 0.02 * (np.arange(ROUNDS) - (ROUNDS - 1)), 0.1, None) + 0.001 * seed


def runs_of(tmp_path, name, curve, seeds=(0, 1, 2)):
    out = []
    for seed in seeds:
        path = write_run(tmp_path / f"{name}-{seed}" / "run.h5", rounds=ROUNDS,
                         config=base_config(tmp_path / f"{name}-{seed}", seed=seed, rounds=ROUNDS))
        with h5py.File(path, "a") as f:
            f["metrics"]["test_acc"][...] = curve(seed)
        out.append(report.read_run(str(path)))
    return out


def rows_of(repro, tmp_path, curves, window=5, seeds=(0, 1, 2)):
    """reproduce.py's rows of a paper with one setting per entry of `curves` ({config: curve(seed)})."""
    settings = [repro.Setting(name, name, "") for name in curves]
    paper = repro.Paper("test", "test", "", settings, 0.9, None, None, window=window)
    groups = {name: runs_of(tmp_path, name, curve, seeds) for name, curve in curves.items()}
    return repro.table_rows(paper, groups)


def fedskip_verdicts(repro, rows):
    """FedSkip's two Table II claims on rows where fedskip and fedavg are given and the others trail."""
    low = {"final_acc": 0.2, "final_acc_std": 0.01, "late_rise": 0.0}
    checks = repro.paper_claims.fedskip_checks({**{n: low for n in ("fedprox", "scaffold", "fednova", "moon",
                                                                     "feddyn")}, **rows})
    return {claim: verdict for verdict, claim, _ in checks}


def test_a_clear_win_holds_and_a_clear_loss_does_not(repro, tmp_path):
    win = rows_of(repro, tmp_path / "win", {"fedskip": lambda s: flat(0.95, s), "fedavg": lambda s: flat(0.90, s)})
    assert abs(win["fedskip"]["late_rise"]) < 1e-9 and win["fedskip"]["final_acc_std"] > 0
    assert set(fedskip_verdicts(repro, win).values()) == {"holds"}
    loss = rows_of(repro, tmp_path / "loss", {"fedskip": lambda s: flat(0.85, s), "fedavg": lambda s: flat(0.92, s)})
    lost = fedskip_verdicts(repro, loss).values()
    assert lost and all(v.startswith("does not hold (the gap -0.07 against the claim exceeds the seeds' spread")
                        and v.endswith("no curve still rising)") for v in lost), lost


def test_a_curve_still_rising_at_the_end_is_not_decided_for_the_horizon(repro, tmp_path):
    """FedSkip at 45 rounds: far below FedAvg, but climbing steeply over its last evaluations."""
    rows = rows_of(repro, tmp_path, {"fedskip": lambda s: rising(0.80, s), "fedavg": lambda s: flat(0.92, s)})
    assert rows["fedskip"]["late_rise"] == pytest.approx(0.02 * 4)        # 2 points a round over 4 rounds
    for verdict in fedskip_verdicts(repro, rows).values():
        assert verdict.startswith("not decided at this scale (horizon: still rising") and "fedskip +8.0" in verdict


def test_a_tie_is_not_decided_never_does_not_hold(repro, tmp_path):
    """FedSkip on Shakespeare: every run at the space's share, the same in every seed (spread 0)."""
    shakespeare = repro.PAPERS["fedskip_shakespeare"]
    curves = {n: (lambda s: np.full(ROUNDS, 0.1868)) for n in ("fedskip", "fedavg", "fedprox", "scaffold",
                                                                 "fednova")}
    rows = rows_of(repro, tmp_path / "tie", curves, window=1)
    verdicts = [v for v, _, _ in shakespeare.checks(rows)]
    assert verdicts and all(v.startswith("not decided at this scale (tied") for v in verdicts)
    # every method flat within the spread near the top: saturation
    near_top = rows_of(repro, tmp_path / "top", {"fedskip": lambda s: flat(0.951, s),
                                                  "fedavg": lambda s: flat(0.95, s)})
    for verdict in fedskip_verdicts(repro, near_top).values():
        assert verdict.startswith("not decided at this scale (saturation: every curve flat near the top")


def test_one_seed_gives_no_spread_to_judge_against(repro, tmp_path):
    rows = rows_of(repro, tmp_path, {"fedskip": lambda s: flat(0.85, s), "fedavg": lambda s: flat(0.92, s)},
                   seeds=(0,))
    assert all(v.startswith("not decided at this scale (one seed") for v in fedskip_verdicts(repro, rows).values())


def test_safls_speed_up_is_not_tried_in_its_own_setting_and_section_iv_claims_keep_their_verdicts(repro):
    """The numbers of docs/results/reproduction.md's SAFL section."""
    def row(final, std, target, target_std, uploads=1000.0, uploads_std=0.0):
        return {"final_acc": final, "final_acc_std": std, "target_round": target, "target_round_std": target_std,
                "uploads": uploads, "uploads_std": uploads_std, "late_rise": 0.0}

    rows = {"fedavg_group_a": row(0.9428, 0.0048, 4, 1, 500), "fedavg": row(0.9252, 0.0086, 22, 6),
            "safl": row(0.9258, 0.0075, 21, 4), "safl_gated": row(0.9258, 0.0069, 6, 1, 924, 14),
            "safl_gated_half": row(0.925, 0.0043, 7, 1), "safl_gated_half_eor": row(0.9179, 0.0093, 7, 1)}
    verdicts = [v for v, _, _ in repro.paper_claims.safl_checks(rows)]
    assert verdicts[:3] == ["holds"] * 3 and verdicts[4] is None
    assert verdicts[3].startswith("not decided at this scale (not tried in its own setting: ")
    assert "does not give Section V's setting" in verdicts[3]


def test_the_section_prints_each_verdict_with_its_cause(repro):
    rows = {"fedskip": {"final_acc": 0.7, "final_acc_std": 0.026, "late_rise": 0.09},
            "fedavg": {"final_acc": 0.921, "final_acc_std": 0.014, "late_rise": 0.001}}
    text = "\n".join(f"- **{v}**" for v, _, _ in repro.paper_claims.fedskip_checks(
        {**{n: rows["fedavg"] | {"final_acc": 0.5} for n in ("fedprox", "scaffold", "fednova", "moon", "feddyn")},
         **rows}))
    assert "does not hold" not in text and text.count("(horizon: still rising over the last evaluations") == 2


def test_fsl_rows_show_the_server_fitting_its_set_and_a_collapse(repro, tmp_path):
    """FSL's diagnostics: the server's own loss on D0 over the last evaluations (near 0: a set the server has
    fitted) and the largest fall of the test accuracy below its best so far (gamma 2's collapse, which a final
    accuracy that recovers would hide); a method without server learning has no server loss."""
    def collapse(seed):
        acc = flat(0.90, seed)
        acc[12:16] = 0.60 + 0.01 * seed                   # 29.8 - 0.8 * seed points below its best, then back
        return acc

    groups = {"fsl_gamma2_c2": runs_of(tmp_path, "g2", collapse),
              "fedavg_c2": runs_of(tmp_path, "fl", lambda s: flat(0.9, s))}
    for seed, run in enumerate(groups["fsl_gamma2_c2"]):
        with h5py.File(run.path, "a") as f:
            f["metrics"].create_dataset("server_loss", data=np.linspace(1.0, 0.01 * (seed + 1), ROUNDS))
    groups["fsl_gamma2_c2"] = [report.read_run(str(run.path)) for run in groups["fsl_gamma2_c2"]]
    paper = repro.Paper("fsl", "test", "", [repro.Setting(n, n, "") for n in groups], 0.8, None, None, window=5)
    rows = repro.table_rows(paper, groups)
    g2, fl = rows["fsl_gamma2_c2"], rows["fedavg_c2"]
    assert g2["fall"] == pytest.approx(np.mean([0.298 - 0.008 * s for s in range(3)]), abs=1e-6)
    last = [np.mean(np.linspace(1.0, 0.01 * (s + 1), ROUNDS)[-5:]) for s in range(3)]
    assert g2["server_loss"] == pytest.approx(np.mean(last))
    assert g2["server_loss_std"] == pytest.approx(np.std(last, ddof=1))
    assert np.isnan(fl["server_loss"]) and fl["fall"] == pytest.approx(0.0, abs=1e-9)
    table = repro.markdown_table(rows)
    assert "server loss on D0" in table and "largest fall" in table


def test_fsl_claims_cover_the_larger_server_set_and_the_harder_task(repro):
    """With the D0 = 400 and SYNTHETIC(1,1) rows present, FSL's claims are judged on them too: a clear FSL win on
    the harder task holds; the server-loss line is a measurement (no verdict)."""
    def row(acc, rise=10.0, loss=np.nan):
        return {"final_acc": acc, "final_acc_std": 0.002, "late_rise": 0.0, "rise_round": rise,
                "rise_round_std": 1.0, "target_round": rise, "fall": 0.01, "fall_std": 0.0,
                "server_loss": loss, "server_loss_std": 0.001}

    names = [f"{m}_c{c}" for m in ("fedavg", "ds", "fsl") for c in (1, 2, 5)] + ["fsl_gamma05_c2", "fsl_gamma2_c2"]
    rows = {n: row(0.94) for n in names}
    rows.update(fsl_c2=row(0.94, loss=0.0001), fsl_d400_c2=row(0.95, loss=0.2), ds_d400_c2=row(0.94),
                synthetic_fedavg=row(0.78, 40.0), synthetic_ds=row(0.80, 30.0), synthetic_fsl=row(0.85, 5.0))
    checks = {claim: (verdict, evidence) for verdict, claim, evidence in repro.paper_claims.fsl_checks(rows)}
    assert checks["SYNTHETIC(1,1): FSL reaches the highest final accuracy"][0] == "holds"
    assert checks["SYNTHETIC(1,1): FSL converges fastest (rise time)"][0] == "holds"
    assert checks["SYNTHETIC(1,1): DS improves over FL"][0] == "holds"
    (loss,) = [v for c, v in checks.items() if c.startswith("the server's own loss on D0")]
    assert loss[0] is None and loss[1] == "D0 = 40: 0.0001 ± 0.0010; D0 = 400: 0.2000 ± 0.0010"
    (larger,) = [v for c, v in checks.items() if c.startswith("C = 2 with a server set of 400 images")]
    assert larger[0] == "holds"
    tie = checks["C = 2: FSL reaches the highest final accuracy"][0]
    assert tie.startswith("not decided at this scale (saturation")


def test_regenerating_a_section_keeps_every_other_section_of_the_published_page(repro):
    """tools/reproduce.py rewrites one paper's section of docs/results/reproduction.md and keeps the rest: every
    section of the published page survives a regeneration (a section outside the markers would be dropped)."""
    from conftest import ROOT

    page = (ROOT / "docs" / "results" / "reproduction.md").read_text()
    again = repro.assemble(page, {})
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert len(headings) >= 8 and [line for line in again.splitlines() if line.startswith("## ")] == headings
