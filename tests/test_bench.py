"""The benchmark script (bench/bench.py): a smoke test of its table, and every workload's fedmpi run against
the benchmark's plain PyTorch reference loop (same seed: the same accuracy, the same model to float
tolerance). No timing assertions: speed targets live in the benchmark's output (docs/performance.md)."""

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


def test_quick_benchmark_prints_the_table(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--workloads", "W2", "QS", "--ranks", "1", "2",
                           "--out", str(tmp_path), "--json", str(tmp_path / "bench.json")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("\nworkload ") + 1:].splitlines()
    assert table[0].split()[:3] == ["workload", "run", "s/round"]
    rows = [line.split() for line in table[2:] if line.strip()]
    w2, qs = [r for r in rows if r[0] == "W2"], [r for r in rows if r[0] == "QS"]
    assert [r[1:3] if r[1] == "-n" else r[1:2] for r in w2] == [["ref"], ["-n", "1"], ["-n", "2"], ["-n", "2"]]
    assert len({r[-1] for r in w2}) == 1, "every row reaches the same accuracy"
    assert w2[-1][3] == "loop"           # the per-client loop at -n 2 (--loop-ranks default)
    # The quickstart against fedmpi at -n 1 (its own baseline: ratio 1.00), the same accuracy at -n 2.
    assert [r[1:3] for r in qs] == [["-n", "1"], ["-n", "2"]] and qs[0][5] == "1.00"
    assert qs[0][-1] == qs[1][-1] and len(w2) + len(qs) == len(rows)


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
