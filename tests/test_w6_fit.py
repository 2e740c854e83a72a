"""W6's scaling-law fit (bench/w6.py): least squares recovers hand-made constants, and the plan leaves out
the 10 M-parameter rows where memory cannot hold them."""

import importlib.util
import math

import pytest
from conftest import ROOT


def _w6():
    spec = importlib.util.spec_from_file_location("fedmpi_bench_w6", ROOT / "bench" / "w6.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_recovers_the_constants_of_exact_data():
    w6 = _w6()
    a, b, c = 0.002, 0.0005, 2e-10         # s, s per log2 P, s per byte
    rows = [{"n": n, "params": p, "fixed_s": a + b * math.log2(n) + c * 4 * p}
            for n in (2, 3, 5, 9, 17) for p in (610, 10_000_000)]
    names, coef, resid = w6.fit(rows)
    assert names[0] == "a (s)" and len(coef) == 3
    assert coef == pytest.approx([a, b, c], rel=1e-6)
    assert max(abs(r) for r in resid) < 1e-12


def test_fit_with_the_oversubscription_term_and_its_residuals():
    w6 = _w6()
    # Hand-computed: at P = 2, 4, 8 (bytes 0) t = 1 + 1 * log2 P, and beyond 2 cores 0.5 s per rank: the
    # points (2, 2.0), (4, 4.0), (8, 7.0), (16, 12.0) with d = 0.5.
    rows = [{"n": n, "params": 0, "fixed_s": t} for n, t in ((2, 2.0), (4, 4.0), (8, 7.0), (16, 12.0))]
    names, coef, resid = w6.fit(rows, cores=2)
    assert len(names) == 4
    assert coef[0] == pytest.approx(1.0) and coef[1] == pytest.approx(1.0) and coef[3] == pytest.approx(0.5)
    assert max(abs(r) for r in resid) < 1e-9


def test_plan_drops_the_large_model_where_memory_is_short():
    w6 = _w6()
    rows = w6.plan(free_bytes=8e9)
    assert ("reduce", "lr", 17) in rows and ("reduce", "mlp10M", 9) in rows
    assert ("reduce", "mlp10M", 17) not in rows      # 17 * 0.7 GB > 0.8 * 8 GB
