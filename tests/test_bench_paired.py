"""Issue 30, one process: the benchmark's pairing and statistics (bench/paired.py) on hand-computed numbers,
pfl-research's simple_cnn in the zoo (`model.name: pfl_cnn`), `server.weighting: uniform` against the
benchmark's reference loop, and W5's CIFAR-10-shaped batches read by `data.name: cifar10`."""

import math

import numpy as np
import pytest
import torch
from conftest import ROOT, bench_module, small_config

from fedmpi import config
from fedmpi.core.errors import ConfigError
from fedmpi.core.models import build_model

paired = bench_module("paired")


# -- pairing and statistics ----------------------------------------------------------------------------

def test_every_fedmpi_run_follows_its_own_baseline_run():
    assert paired.launch_order(["a", "b"], 2) == [(None, 0), ("a", 0), (None, 0), ("b", 0),
                                                  (None, 1), ("a", 1), (None, 1), ("b", 1)]
    assert paired.launch_order(["a"], 1) == [(None, 0), ("a", 0)]
    with pytest.raises(ValueError):
        paired.launch_order(["a"], 0)


def test_figures_of_runs_and_pairs_by_hand():
    assert paired.later_rounds([9.0, 2.0, 4.0, 3.0]) == 3.0        # the first round left out
    assert paired.later_rounds([5.0]) == 5.0
    assert paired.pair_ratios([2.0, 4.0, 1.0], [1.0, 1.0, 0.6]) == [0.5, 0.25, 0.6]
    assert paired.spread([0.5, 0.25, 0.6]) == (0.5, 0.25, 0.6)
    assert paired.host_variation([1.0, 1.2, 0.9]) == pytest.approx(0.3)     # (1.2 - 0.9) / 1.0
    assert paired.host_variation([2.0]) == 0.0
    with pytest.raises(ValueError):
        paired.pair_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        paired.pair_ratios([0.0], [1.0])


def _sample(rounds, busy=None, whole=10.0):
    return {"rounds": rounds, "busy_rounds": busy or rounds, "whole_s": whole, "cpu_s": 1.0, "server_cpu_s": math.nan,
            "peak_rss_mb": [100.0], "acc": 0.5, "device": "cpu", "mpi_bytes_per_round": 0.0, "fl_bytes": 0.0,
            "training_ranks": 2}


def test_a_row_is_the_median_of_its_pairs_ratios_not_a_ratio_of_medians():
    # The host slows down in the second pair and speeds up in the third: the baseline varies 2x, the pair
    # ratios do not. Ratio of medians would be 0.6 / 1.0; the pairs say 0.5, 0.5, 0.6.
    base = [_sample([9, 1.0, 1.0]), _sample([9, 2.0, 2.0]), _sample([9, 0.5, 0.5])]
    runs = [_sample([9, 0.5, 0.5], [9, 0.4, 0.4]), _sample([9, 1.0, 1.0], [9, 1.0, 1.0]), _sample([9, 0.3, 0.3])]
    row = paired.summarize_row(base, runs)
    assert row["ratio"] == (0.5, 0.5, 0.6) and row["ratios"] == [0.5, 0.5, 0.6]
    assert row["busy_ratio"] == 0.5                   # median of 0.4, 0.5, 0.6
    assert row["s_round"] == 0.5 and row["eff"] == pytest.approx(1.0)      # 1 / (2 ranks * 0.5)
    b = paired.summarize_baseline(base)
    assert b["s_round"] == 1.0 and b["ratio"] == (1.0, 0.5, 2.0) and b["variation"] == pytest.approx(1.5)
    cells = paired.format_row("W2", "-n 2", row, 100)
    assert cells[4:6] == ("0.500", "0.500-0.600") and cells[8] == "200" and cells[9] == "2.00"
    assert cells[-1] == "NOT met (>= 8x)"


def test_paced_pair_ratio_is_the_median_of_round_by_round_ratios():
    # Paced (both samples "paced"): round t against round t, rounds 2..; the host slows down for rounds 3-4
    # and both jobs see it. Ratio of the runs' medians would be 1.0 / 2.0; the neighbours say 0.5, 0.5, 0.6.
    base = {**_sample([9, 2.0, 4.0, 4.0]), "paced": True}
    run = {**_sample([1, 1.0, 2.0, 2.4], [1, 0.9, 1.8, 2.4]), "paced": True}
    assert paired.pair_ratio(base, run) == 0.5
    assert paired.pair_ratio(base, run, "busy_rounds") == 0.45
    # Not paced (runs one after the other): the ratio of the runs' figures.
    assert paired.pair_ratio(_sample([9, 2.0, 4.0, 4.0]), _sample([1, 1.0, 2.0, 2.4])) == 0.5
    assert paired.pair_ratio(base, {**run, "paced": False}) == 0.5     # 2.0 / 4.0
    row = paired.summarize_row([base, base], [run, {**run, "rounds": [1, 1.2, 2.4, 2.4]}])
    assert row["ratios"] == [0.5, 0.6] and row["ratio"] == (0.55, 0.5, 0.6)


pacing = bench_module("pacing")

# The turns end on events (the job's report of its round, or its exit: pacing.Turns.turn); these limits only
# guard against a hang, so they are generous: a loaded machine once took more than 60 s for a turn that
# includes starting Python. pytest-timeout (pyproject.toml) ends a hung test before them.
HANG_S = 600

# A job of `processes` processes that take turns through bench/pacing.py: each waits for its turn, logs
# (name, round, start, end), and process 0 reports the round done.
_PACED_JOB = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import pacing
name, proc, rounds, log = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
baton = pacing.Baton.from_env()
time.sleep(float(sys.argv[6]) if len(sys.argv) > 6 else 0.0)     # a late start (loading its data)
for t in range(rounds):
    baton.wait()
    began = time.monotonic()
    time.sleep(0.02)
    with open(log, "a") as fh:
        fh.write(f"{name} {proc} {t} {began} {time.monotonic()}\\n")
    # As MPI ranks sharing one `go` pipe (each round's collectives): none leaves round t before every peer
    # has run it, so none reads a byte of the next turn meant for a slower peer.
    peers = int(os.environ.get("PACED_PEERS", "1"))
    while sum(line.split()[:3:2] == [name, str(t)] for line in open(log)) < peers:
        time.sleep(0.005)
    if proc == 0:
        baton.done()
if len(sys.argv) > 7:           # a shutdown that takes time after the last round (the log's last writes)
    time.sleep(float(sys.argv[7]))
    with open(log, "a") as fh:
        fh.write(f"{name} {proc} exit {time.monotonic()} {time.monotonic()}\\n")
"""


def test_paced_jobs_take_strict_turns_and_never_overlap(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_PACED_JOB)
    log, rounds = tmp_path / "log.txt", 4
    jobs = []
    for name, processes in (("A", 1), ("B", 2)):
        turns = pacing.Turns(tmp_path / name, processes)
        args = [sys.executable, str(script), str(ROOT / "bench"), name]
        # B's process 0 starts late (0.5 s), as a slow rank does: the case where a peer could run ahead
        procs = [subprocess.Popen([*args, str(i), str(rounds), str(log), str(0.5 if processes > 1 and i == 0 else 0)],
                                  env={**os.environ, **turns.env, "PACED_PEERS": str(processes)})
                 for i in range(processes)]
        jobs.append((turns, procs))
    try:
        assert pacing.take_turns([(turns, procs[0]) for turns, procs in jobs], rounds, timeout=HANG_S)
        for _, procs in jobs:
            assert [p.wait(timeout=HANG_S) for p in procs] == [0] * len(procs)
    finally:
        for turns, procs in jobs:
            for p in procs:
                p.kill()
            turns.close()
    lines = [line.split() for line in log.read_text().splitlines()]
    # Round t of A, then round t of B (both of its processes), then round t + 1 of A...
    starts = sorted((float(began), name, int(t)) for name, _, t, began, _ in lines)
    assert [(name, t) for _, name, t in starts] == [(n, t) for t in range(rounds) for n in ("A", "B", "B")]
    # ...and the reporting process's round ends before the other job's next round begins.
    def span(name, proc, t):
        return next((float(began), float(end)) for n, p, tt, began, end in lines
                    if n == name and int(p) == proc and int(tt) == t)

    for t in range(rounds):
        assert span("A", 0, t)[1] <= min(span("B", 0, t)[0], span("B", 1, t)[0])
        if t + 1 < rounds:
            assert span("B", 0, t)[1] <= span("A", 0, t + 1)[0]


def test_a_jobs_last_round_waits_until_the_jobs_before_it_have_exited(tmp_path):
    """A's shutdown (0.6 s after its last round) does not share the machine with B's last round; B's earlier
    rounds still follow A's at once."""
    import os
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_PACED_JOB)
    log, rounds = tmp_path / "log.txt", 3
    jobs = []
    for name, teardown in (("A", "0.6"), ("B", "0")):
        turns = pacing.Turns(tmp_path / name, 1)
        proc = subprocess.Popen([sys.executable, str(script), str(ROOT / "bench"), name, "0", str(rounds), str(log),
                                 "0", teardown], env={**os.environ, **turns.env})
        jobs.append((turns, proc))
    try:
        assert pacing.take_turns(jobs, rounds, timeout=HANG_S)
        assert [p.wait(timeout=HANG_S) for _, p in jobs] == [0, 0]
    finally:
        for turns, p in jobs:
            p.kill()
            turns.close()
    lines = [line.split() for line in log.read_text().splitlines()]
    began = {(n, t): float(b) for n, _, t, b, _ in lines}
    assert began[("B", str(rounds - 1))] >= began[("A", "exit")]
    assert began[("B", "0")] < began[("A", "exit")]


def test_a_turn_waits_for_every_reporter(tmp_path):
    """The two-process floor ("ref x2"): both processes report each round; the turn ends when both have. The
    second starts late (1.5 s): from one shared `go` pipe the first would have read its byte and run its
    round 1 inside turn 0; each reads its own pipe."""
    import os
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_PACED_JOB.replace("if proc == 0:", "if True:"))
    log, rounds = tmp_path / "log.txt", 3
    turns = pacing.Turns(tmp_path / "floor", 2, reporters=2)
    procs = [subprocess.Popen([sys.executable, str(script), str(ROOT / "bench"), "F", str(i), str(rounds), str(log),
                               str(1.5 * i)], env={**os.environ, **pacing.part_env(turns.env, i)}) for i in range(2)]
    try:
        for t in range(rounds):
            turns.turn(procs[0], timeout=HANG_S)
            done = [line.split() for line in log.read_text().splitlines()]
            expected = [(r, q) for r in range(t + 1) for q in (0, 1)]
            assert sorted((int(tt), int(p)) for _, p, tt, _, _ in done) == expected
        assert [p.wait(timeout=HANG_S) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
        turns.close()


def test_the_floors_turn_is_over_only_when_every_process_is():
    # A process that finished its last round may exit while the other still runs it: not a failure (a bench
    # run of record stopped there: "a paced job ended before its 4 rounds"); a failed process is one.
    class Proc:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    class Share:
        def __init__(self, code):
            self.proc = Proc(code)

    floor = object.__new__(bench_module("bench").FloorJob)
    for codes, want in (((0, None), None), ((None, None), None), ((0, 0), 0), ((None, 3), 3), ((0, 1), 1)):
        floor.jobs = [Share(c) for c in codes]
        assert floor.poll() == want, codes


def test_a_paced_job_that_fails_stops_the_turns(tmp_path):
    import subprocess
    import sys

    turns = pacing.Turns(tmp_path / "job", 1)
    try:
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        assert pacing.take_turns([(turns, proc)], 5, timeout=HANG_S) is False
        assert proc.wait(timeout=HANG_S) == 3
    finally:
        turns.close()


def test_target_status_reads_the_bound_the_right_way():
    assert paired.target_status("W1", "-n 3", 0.53) == "met (<= 0.53)"
    assert paired.target_status("W1", "-n 3", 0.531) == "NOT met (<= 0.53)"
    assert paired.target_status("W2", "-n 2", 0.125) == "met (>= 8x)"
    assert paired.target_status("W2", "-n 2", 0.126) == "NOT met (>= 8x)"
    assert paired.target_status("W3", "-n 2", 0.1) == ""


def test_marked_block_is_replaced_and_missing_markers_refused():
    doc = f"head\n{paired.BEGIN}\nold\n{paired.END}\ntail\n"
    assert paired.replace_marked(doc, "| a |\n") == f"head\n{paired.BEGIN}\n| a |\n{paired.END}\ntail\n"
    with pytest.raises(ValueError):
        paired.replace_marked("no markers here", "x")
    with pytest.raises(ValueError):
        paired.replace_marked(f"{paired.END}\n{paired.BEGIN}\n", "x")
    # markers quoted in prose are not markers
    quoted = f"the markers `{paired.BEGIN}` and `{paired.END}`\n" + doc
    assert paired.replace_marked(quoted, "new") == f"the markers `{paired.BEGIN}` and `{paired.END}`\n" \
        f"head\n{paired.BEGIN}\nnew\n{paired.END}\ntail\n"
    assert paired.markdown_table(("a", "b"), [("1", "2")]) == "| a | b |\n| --- | --- |\n| 1 | 2 |"


def test_the_performance_page_holds_the_paired_block():
    """`--done-when --markdown docs/results/performance.md` rewrites the page's block: its markers are there once,
    in order, and the block holds the paired table with the command that reproduces it."""
    page = (ROOT / "docs" / "results" / "performance.md").read_text()
    assert page.count(paired.BEGIN) == page.count(paired.END) == 1
    block = page[page.index(paired.BEGIN):page.index(paired.END)]
    assert "python bench/bench.py --done-when --markdown docs/results/performance.md" in block
    assert "| workload | run | runs | s/round |" in block


# -- pfl-research's simple_cnn ---------------------------------------------------------------------------

def test_pfl_cnn_has_pfls_layers_and_parameter_count():
    torch.manual_seed(0)
    model = build_model(config.from_dict({"model": {"name": "pfl_cnn"}}).model, (3, 32, 32), 10)
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 64 * 14 * 14), (128,), (10, 128), (10,)]
    # pfl's own count (its test_cnn.py): 3x3 conv kernels + biases, then (32 - 4) // 2 = 14 after the pool
    assert sum(p.numel() for p in model.parameters()) == (27 * 32 + 32) + (9 * 32 * 64 + 64) + (12544 * 128 + 128) \
        + (128 * 10 + 10) == 1_626_442
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "Dropout", "Flatten", "Linear", "ReLU",
                     "Dropout", "Linear"]
    assert [m.p for m in model if isinstance(m, torch.nn.Dropout)] == [0.25, 0.5]
    assert all(m.padding == (0, 0) and m.kernel_size == (3, 3) for m in model if isinstance(m, torch.nn.Conv2d))
    # Glorot-uniform weights: bound sqrt(6 / (fan_in + fan_out)), reached to within a few percent
    for m in (m for m in model if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))):
        fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(m.weight)
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert 0.95 * bound < float(m.weight.detach().abs().max()) <= bound
        assert float(m.bias.detach().abs().max()) <= 1.0 / math.sqrt(fan_in)     # PyTorch's default bias, as pfl
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ConfigError, match="pfl_cnn"):
        build_model(config.from_dict({"model": {"name": "pfl_cnn"}}).model, (784,), 10)


# -- server.weighting ------------------------------------------------------------------------------------

def test_weighting_is_checked_and_hash_optional():
    with pytest.raises(ConfigError, match="server.weighting"):
        config.from_dict({"server": {"weighting": "equal"}})
    with pytest.raises(ConfigError, match="server.weighting"):
        config.from_dict({"server": {"weighting": "uniform", "aggregator": "median"}})
    assert config.from_dict({"server": {"weighting": "samples"}}).hash() == config.from_dict({}).hash()
    assert config.from_dict({"server": {"weighting": "uniform"}}).hash() != config.from_dict({}).hash()


def test_uniform_weighting_equals_the_reference_loops_mean_of_deltas(tmp_path):
    """Dirichlet clients of unequal sizes: fedmpi with weights 1 equals the benchmark's reference loop (its
    own nn.Module / torch.optim.SGD implementation, weight 1 per client), and differs from weights n_i."""
    import fedmpi

    bench = bench_module("bench")
    cfg = small_config(tmp_path / "u", rounds=2, server={"clients_per_round": 5, "weighting": "uniform"},
                       eval={"every": 2})
    result = fedmpi.simulate(cfg)
    uniform = bench.reference(cfg)["global"]
    by_samples = bench.reference({**cfg, "server": {"clients_per_round": 5}})["global"]
    np.testing.assert_allclose(result.model, uniform, rtol=1e-5, atol=1e-6)
    assert np.abs(uniform - by_samples).max() > 1e-3


# -- W5's data -------------------------------------------------------------------------------------------

def test_w5_batches_are_read_by_the_cifar10_loader(tmp_path):
    from fedmpi.data import load_dataset

    w5 = bench_module("w5")
    root = w5.write_cifar10_like(tmp_path, train=53, test=7)
    stamp = (root / "cifar-10-batches-py" / "data_batch_1").stat().st_mtime_ns
    assert w5.write_cifar10_like(tmp_path, train=53, test=7) == root       # kept: same sizes
    assert (root / "cifar-10-batches-py" / "data_batch_1").stat().st_mtime_ns == stamp
    ds = load_dataset(config.from_dict({"data": {"name": "cifar10", "root": str(root)}}))
    assert ds.x_train.shape == (53, 3, 32, 32) and ds.x_test.shape == (7, 3, 32, 32) and ds.num_classes == 10
    assert ds.y_train.min() >= 0 and ds.y_train.max() <= 9


# -- fedmpi's own cost removed (part 2): the same answers, cheaper ----------------------------------------

def test_nonfinite_check_by_float32_sum_keeps_the_float64_answer():
    """The global model's check sums in float32 first: finite entries whose float32 sum overflows are still
    finite (the float64 sum decides), any NaN or inf entry is found and counted."""
    from types import SimpleNamespace

    from fedmpi.round.engine import nonfinite

    stats = SimpleNamespace(seen=0)
    big = torch.full((8,), 3e38, dtype=torch.float32)
    assert not math.isfinite(float(big.sum())) and nonfinite({}, stats, big) == ""
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.zeros(1000)
        x[[3, 700]] = bad
        assert nonfinite({}, stats, x) == "2 non-finite entries in the global model"
    mixed = torch.cat([big, torch.tensor([-math.inf])])
    assert nonfinite({}, stats, mixed) == "1 non-finite entries in the global model"
    assert nonfinite({}, stats, torch.randn(1000, generator=torch.Generator().manual_seed(0))) == ""


def test_bad_bench_options_exit_2_before_anything_runs(tmp_path):
    import subprocess
    import sys

    doc = tmp_path / "doc.md"
    doc.write_text("no markers\n")
    for args, names in ((["--markdown", str(doc)], str(doc)), (["--pairs", "0"], "--pairs")):
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench.py"), "--workloads", "W2",
                               "--out", str(tmp_path / "runs"), *args], capture_output=True, text=True, timeout=HANG_S,
                              cwd=ROOT)
        assert proc.returncode == 2 and names in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "runs").exists() and proc.stdout == ""
    assert doc.read_text() == "no markers\n"
