"""tools/lora_study.py: the federated LoRA study's paired table and figure, on fabricated runs whose
perplexities are set by hand."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import tool_module
from run_files import base_config, write_run

study = tool_module("lora_study")

# rule -> seed -> test perplexity at rounds 0..3 (every round evaluated)
PERPLEXITY = {"fedit": {0: [5.0, 4.0, 3.0, 2.0], 1: [6.0, 5.0, 4.0, 3.0]},
              "ffa_lora": {0: [5.0, 4.0, 3.0, 2.5], 1: [6.0, 5.0, 4.0, 3.1]}}


def write_study(root, running=()):
    for rule, seeds in PERPLEXITY.items():
        for seed, values in seeds.items():
            out = root / f"{rule}_seed-{seed}"
            cfg = base_config(out, seed=seed, algorithm={"name": rule})
            status = "running" if (rule, seed) in running else "finished"
            path = write_run(out / "run.h5", rounds=4, config=cfg, status=status)
            with h5py.File(path, "a") as f:
                f["metrics/test_perplexity"] = np.array(values)
                f["metrics/test_loss"][...] = np.log(values)
    return root


def test_the_table_compares_each_rule_with_the_baseline_within_each_seed(tmp_path, capsys):
    assert study.main([str(write_study(tmp_path))]) == 0
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()[2:] if "|" in line}
    # final perplexities: fedit 2.0 and 3.0 (mean 2.5, std 0.707); ffa_lora 2.5 and 3.1 (mean 2.8, std 0.424)
    assert "| 2.500 ± 0.707 | (baseline) |" in rows["fedit"]
    # paired at the last round: 2.5 - 2.0 = +0.5 (seed 0), 3.1 - 3.0 = +0.1 (seed 1); over the second half of
    # the rounds (the last two) each seed's mean: (0 + 0.5) / 2 = 0.25 and (0 + 0.1) / 2 = 0.05
    assert "| 2.800 ± 0.424 | +0.300 (+0.100 to +0.500) | +0.150 (+0.050 to +0.250) |" in rows["ffa_lora"]
    assert "| 2.500 ± 0.707 | (baseline) | (baseline) |" in rows["fedit"]


def test_a_run_not_finished_is_left_out_and_named(tmp_path, capsys):
    assert study.main([str(write_study(tmp_path, running={("ffa_lora", 1)}))]) == 0
    out = capsys.readouterr()
    assert "left out ffa_lora_seed-1 (running)" in out.err
    assert "| ffa_lora | 1 |" in out.out and "+0.500 (+0.500 to +0.500)" in out.out


def test_the_figure_and_the_markdown_are_written(tmp_path):
    root = write_study(tmp_path / "runs")
    assert study.main([str(root), "--plot", str(tmp_path / "f.png"), "--markdown", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "f.png").stat().st_size > 0
    assert "(baseline)" in (tmp_path / "t.md").read_text()


@pytest.mark.parametrize("args, says", [(["MISSING"], "no run.h5 found"),
                                        (["RUNS", "--baseline", "fedavg"], "--baseline 'fedavg': no finished run")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, says):
    root = write_study(tmp_path / "runs")
    args = [a.replace("MISSING", str(tmp_path / "none")).replace("RUNS", str(root)) for a in args]
    assert study.main(args) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
