"""The benchmark script (bench/bench.py): a smoke test of its table, and every workload's fedmpi run against
the benchmark's plain PyTorch reference loop (same seed: the same accuracy, the same model to float
tolerance). No timing assertions: speed targets live in the benchmark's output (docs/results/performance.md)."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, read_global, read_metrics

pytestmark = pytest.mark.mpi

BENCH = ROOT / "bench" / "bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("fedmpi_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_benchmark_prints_the_paired_table(tmp_path):
    """W2 and QS with one pair each (the baseline, then fedmpi): the table, the JSON record and the markdown
    block written between the markers of a document."""
    import json

    paired = load_bench().paired
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{paired.BEGIN}\nold table\n{paired.END}\nafter\n")
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--workloads", "W2", "QS", "--ranks", "2",
                           "--loop-ranks", "--out", str(tmp_path), "--json", str(tmp_path / "bench.json"),
                           "--markdown", str(doc)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("\nworkload ") + 1:].splitlines()
    assert table[0].split()[:5] == ["workload", "run", "runs", "s/round", "x"]
    rows = [line.split() for line in table[2:] if line.strip() and line[:2] in ("W2", "QS")]
    assert [r[:2] if r[1] == "ref" else r[:3] for r in rows] == [["W2", "ref"], ["W2", "-n", "2"], ["QS", "-n", "1"],
                                                                 ["QS", "-n", "2"]]
    record = json.loads((tmp_path / "bench.json").read_text())
    assert list(record) == ["W2 ref", "W2 -n 2", "QS -n 1", "QS -n 2"]
    for key in ("W2 -n 2", "QS -n 2"):
        summary = record[key]["summary"]
        assert len(summary["ratios"]) == 1 and summary["ratio"][0] == summary["ratios"][0]
    # the same accuracy in every run of a workload: the pairs do the same arithmetic
    for wl in ("W2", "QS"):
        assert len({s["acc"] for k, v in record.items() if k.startswith(wl) for s in v["samples"]}) == 1
    text = doc.read_text()
    assert text.startswith(f"before\n{paired.BEGIN}\n") and text.endswith(f"{paired.END}\nafter\n")
    assert "old table" not in text and "| W2 | ref |" in text and "| QS | `-n 2` |" in text


# Shortened workloads: the same models, data and rules, fewer rounds and clients per round.
SHORT = {
    "W1": {"server": {"clients_per_round": 3}},
    "W2": {"server": {"clients_per_round": 40}},
    "W3": {"server": {"clients_per_round": 6}},
}


@pytest.mark.parametrize("name", list(SHORT))
def test_workload_reaches_the_reference_loops_accuracy(tmp_path, name):
    bench = load_bench()
    cfg = bench.workload_config(name, tmp_path / "out", rounds=2, vectorize="auto", overrides=SHORT[name])
    ref = bench.reference(cfg)
    run = bench.run_fedmpi(cfg, 2, tmp_path)
    metrics, _ = read_metrics(tmp_path / "out")
    assert run["acc"] == ref["acc"]
    np.testing.assert_allclose(read_global(tmp_path / "out"), ref["global"], rtol=1e-5, atol=1e-6)
    assert len(metrics["round"]) == 2 and run["device"] == "cpu"
