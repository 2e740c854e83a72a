"""Reduced-precision transport and sliced transfers under mpiexec, in the launches at -n 1 and -n 3 shared
with other files (tests/session_runs.py):
  - bfloat16 and float16 wires (FedAvg; gated SAFL, whose vectors travel by masked gather) give the same
    accuracy and model at -n 1 and -n 3, and a model different from float32's (the rounding is active);
  - /metrics counts 2 bytes per entry: bytes_down = S * dim * 2 (hand-computed), bytes_up half float32's;
  - with a 4 kB slice limit for every MPI transfer (FEDMPI_MPI_CHUNK_BYTES, node buffers off), FedAvg,
    gated SAFL and median aggregation at -n 3 give the results of the unsliced -n 1 run.
"""

import numpy as np
import pytest
import session_runs
from conftest import read_global, read_metrics, small_config, write_config

pytestmark = pytest.mark.mpi

R, PER_ROUND = 3, 5
DIM = 28 * 28 * 10 + 10        # lr on mnist5k
SAFL = {"name": "safl", "L": 4.0, "eps": 0.5, "mix": "end_of_round", "gating": True, "nu": 2.0}
RUNS = {
    "fedavg_f32": {},
    "fedavg_bf16": {"runtime": {"wire_dtype": "bfloat16"}},
    "fedavg_fp16": {"runtime": {"wire_dtype": "float16"}},
    "safl_f32": {"algorithm": SAFL},
    "safl_bf16": {"algorithm": SAFL, "runtime": {"wire_dtype": "bfloat16"}},
    "median_f32": {"server": {"clients_per_round": PER_ROUND, "aggregator": "median"}},
}
SLICED = ("fedavg_f32", "safl_f32", "median_f32")
SLICE_ENV = {"FEDMPI_MPI_CHUNK_BYTES": "4096", "FEDMPI_NODE_BUFFERS": "0"}


def _config(out, sections):
    runtime = {"threads": 1, "progress": "lines", **sections.get("runtime", {})}
    return small_config(out, rounds=R, eval={"every": 1}, **{**sections, "runtime": runtime})


@session_runs.plan
def wire_runs(base):
    steps = {1: [], 3: []}
    for name, sections in RUNS.items():
        # Every run at -n 1; at -n 3 the rounded ones as they are, the float32 ones sliced (their unsliced -n 3
        # runs equal -n 1 by the fidelity tests).
        for n in (1, 3) if name not in SLICED else (1,):
            cfg = write_config(base / f"{name}-n{n}.yaml", _config(base / name / f"n{n}", sections))
            steps[n].append(["run", cfg, "--overwrite"])
        if name in SLICED:
            cfg = write_config(base / f"{name}-sliced.yaml", _config(base / name / "sliced", sections))
            steps[3].append([SLICE_ENV, "run", cfg, "--overwrite"])
    return steps, base


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, wire_runs)


def _same_run(a, b):
    ma, attrs = read_metrics(a)
    mb, _ = read_metrics(b)
    assert attrs["status"] == "finished" and len(ma["round"]) == R
    np.testing.assert_array_equal(ma["test_acc"], mb["test_acc"])
    np.testing.assert_allclose(read_global(a), read_global(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["fedavg_bf16", "fedavg_fp16", "safl_bf16"])
def test_rounded_wire_is_the_same_at_one_and_three_ranks(runs, name):
    _same_run(runs / name / "n1", runs / name / "n3")
    plain = read_global(runs / name.replace("_bf16", "_f32").replace("_fp16", "_f32") / "n1")
    rounded = read_global(runs / name / "n1")
    assert not np.array_equal(plain, rounded)
    np.testing.assert_allclose(rounded, plain, atol=0.05)     # a few rounds of rounding: close, not equal


def test_bytes_are_counted_at_the_wire_width(runs):
    f32, _ = read_metrics(runs / "fedavg_f32" / "n1")      # (the same plan at any -n: the same uploads)
    for name in ("fedavg_bf16", "fedavg_fp16"):
        half, _ = read_metrics(runs / name / "n3")
        np.testing.assert_array_equal(half["bytes_down"], np.full(R, PER_ROUND * DIM * 2))
        np.testing.assert_array_equal(half["bytes_up"], half["uploads"] * DIM * 2)
        np.testing.assert_array_equal(half["bytes_up"] * 2, f32["bytes_up"])
    np.testing.assert_array_equal(f32["bytes_down"], np.full(R, PER_ROUND * DIM * 4))


@pytest.mark.parametrize("name", SLICED)
def test_sliced_transfers_give_the_unsliced_results(runs, name):
    _same_run(runs / name / "n1", runs / name / "sliced")
