"""Counts bounded before anything is expanded, and the sweep spec as strict as a run config: each case one line
naming the key, exit 2, before anything starts."""

from __future__ import annotations

import pytest
import yaml
from conftest import write_config

from fedmpi.cli import main
from fedmpi.sweep import spec

TINY = {"seed": 0, "rounds": 1, "out": "unused", "data": {"name": "synthetic"}, "partition": {"clients": 8},
        "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 10}, "server": {"clients_per_round": 3},
        "runtime": {"threads": 1, "progress": "off"}}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Every case works in tmp_path, where a spec's relative `out` lands (the working folder's, not the spec's)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def base(tmp_path):
    return write_config(tmp_path / "base.yaml", TINY)


def refused_lines(capsys, tmp_path, mapping):
    """The stderr lines of `fedmpi sweep` on the spec `mapping` (a mapping or the YAML text), refused with
    exit 2 (asserted), nothing made."""
    path = tmp_path / "spec.yaml"
    path.write_text(mapping if isinstance(mapping, str) else yaml.safe_dump(mapping, sort_keys=False))
    assert main(["sweep", str(path)]) == 2
    assert not (tmp_path / "out").exists()
    return capsys.readouterr().err.splitlines()


def test_h05_a_huge_grid_is_counted_not_expanded(tmp_path, base, capsys, monkeypatch):
    """H05: 4 keys x 100 values (10^8 experiments) were expanded in full (4.9 GB after 82 s) before the
    100,000 limit was checked; the count is the product of the lists' lengths."""
    def expanded(*args, **kwargs):
        raise AssertionError("the grid was expanded before its size was checked")

    monkeypatch.setattr(spec, "expand", expanded)
    grid = {key: [round(0.01 * i, 2) for i in range(1, 101)]
            for key in ("client.lr", "client.momentum", "client.weight_decay", "server.lr")}
    (line,) = refused_lines(capsys, tmp_path, {"base": "base.yaml", "out": "out", "grid": grid})
    assert "gives 100000000 experiments; at most 100000" in line, line
    # Sets and seeds count as factors too.
    sets = [{"client.epochs": e} for e in range(1, 11)]
    (line,) = refused_lines(capsys, tmp_path, {"base": "base.yaml", "out": "out", "sets": sets,
                                               "grid": {"client.lr": grid["client.lr"]},
                                               "seeds": list(range(101))})
    assert "gives 101000 experiments" in line, line


H10 = [
    ({"sets": []}, "sets = []: is empty"),
    ({"sets": {}}, "sets = {}: is empty"),
    ({"grid": {}}, "grid = {}: is empty"),
    ('base: base.yaml\nout: out\nsets: [{name: "a\\x1b[31m", client.lr: 0.1}]\n',
     "sets[0].name = 'a\\x1b[31m': must not hold control characters"),
    ('base: base.yaml\nout: out\nsets: [{name: "a\\x85", client.lr: 0.1}]\n', "must not hold control characters"),
    ({"sets": [{"name": "..", "client.lr": 0.1}]}, "sets[0].name = '..': gives no folder name"),
    ({"sets": [{"name": "///", "client.lr": 0.1}]}, "sets[0].name = '///': gives no folder name"),
    ('base: base.yaml\nout: out\nsets: {"a\\x01": [{client.lr: 0.1}]}\n', "sets: list name 'a\\x01' must be"),
    ({"sets": {"": [{"client.lr": 0.1}]}}, "sets: list name '' must be a non-empty string"),
    ('base: "b\\x01.yaml"\nout: out\n', "base = 'b\\x01.yaml': holds the control character"),
    ('base: base.yaml\nout: "o\\x01"\n', "out = 'o\\x01': holds the control character"),
    ({"seeds": [2 ** 64]}, "seeds = [18446744073709551616]: must be a non-empty list of distinct integers in [0, "
                           "2^63)"),
    ({"seeds": [-1]}, "seeds = [-1]: must be a non-empty list of distinct integers in [0, 2^63)"),
    ({"ranks": 10 ** 30}, "ranks = 1000000000000000000000000000000: must be an integer in [1, "),
    ({"ranks": 10 ** 7}, "ranks = 10000000: must be an integer in [1, "),
    ({"ranks": {"clients_per_rank": 2 ** 64}}, "ranks.clients_per_rank = 18446744073709551616: must be an integer "
                                                "in [1, "),
    ({"ranks": {"clients_per_rank": 0}}, "ranks.clients_per_rank = 0: must be an integer in [1, "),
    ({"ranks": {"clients_per_rank": 2, "max": 2 ** 70}}, "ranks.max = 1180591620717411303424: must be an integer "
                                                          "in [1, "),
]


@pytest.mark.parametrize("entries, problem", H10, ids=[p for _, p in H10])
def test_h10_the_sweep_spec_is_as_strict_as_a_run_config(tmp_path, base, capsys, entries, problem):
    """H10: `sets: []` ran one experiment named `run`; control characters in set names were accepted; an
    out-of-range seed or rank was told "must be an integer"."""
    mapping = entries if isinstance(entries, str) else {"base": "base.yaml", "out": "out", **entries}
    lines = refused_lines(capsys, tmp_path, mapping)
    assert len(lines) == 1 and problem in lines[0], lines


@pytest.mark.parametrize("out", [5, [1], {"a": 1}, True])
def test_h10_an_out_of_the_wrong_type_is_told_once(tmp_path, base, capsys, out):
    """H10: `out: 5` got a second line about '', a value the user did not write."""
    lines = refused_lines(capsys, tmp_path, {"base": "base.yaml", "out": out})
    assert len(lines) == 1 and "out = " in lines[0] and "must be a string" in lines[0], lines


# --- numbers and weights in a run config ------------------------------------------------------------------------

def _run(tmp_path, flag, *overrides):
    """`fedmpi run` of the tiny config with `overrides` (in this process, bounded): its Outcome."""
    from fuzz_support import cli

    path = write_config(tmp_path / "run.yaml", {**TINY, "out": str(tmp_path / "run-out")})
    return cli("run", path, flag, *overrides)


def _one_error_line(outcome):
    lines = [line for line in outcome.err.splitlines() if line.strip()]
    assert outcome.code == 2 and not outcome.crash and len(lines) == 1, (outcome.code, outcome.err, outcome.crash)
    return lines[0]


@pytest.mark.parametrize("flag", ["--dry-run", "--overwrite"])
def test_h07_server_tau_far_beyond_its_range_is_refused_before_the_run(tmp_path, flag):
    """H07: server.tau=1e300 with adam ended "fedmpi: OverflowError", exit 1, while --dry-run passed it;
    server.tau=1e7 was accepted."""
    for tau in ("1e300", "1e7"):
        line = _one_error_line(_run(tmp_path, flag, "server.optimizer=adam", f"server.tau={tau}"))
        assert f"server.tau = {float(tau)!r}: must be a number in (0, 1000]" in line, line
    assert not (tmp_path / "run-out").exists()


@pytest.mark.parametrize("aggregator, key, value", [
    ("centered_clip", "iterations", 10 ** 12), ("geomed", "iterations", 10 ** 11),
    ("centered_clip", "tau", 1e300), ("norm_bound", "bound", 1e300), ("geomed", "nu", 1e300)])
def test_h06_h07_robust_keys_are_bounded(tmp_path, aggregator, key, value):
    """H06: geomed at 10^11 iterations or centered_clip at 10^12 never ended its first round (and a stop
    request, heard at round boundaries, never came); H07: server.robust.tau, .bound and .nu at 1e300 were
    accepted. Refused before anything runs (the cli call is bounded at 60 s: the old code hung there)."""
    line = _one_error_line(_run(tmp_path, "--overwrite", f"server.aggregator={aggregator}",
                                f"server.robust.{key}={value}"))
    assert line.split("error: ")[-1].startswith(f"server.robust.{key} = ") and "must be " in line \
        and (" in [" in line or " in (" in line), line
    assert not (tmp_path / "run-out").exists()


def test_h06_the_largest_robust_iterations_end_a_round(tmp_path):
    """At the bound, a round of geomed and of centered_clip ends (bounded work per round)."""
    from fedmpi.robust.keys import MAX_ITERATIONS

    for aggregator in ("geomed", "centered_clip"):
        outcome = _run(tmp_path, "--overwrite", f"server.aggregator={aggregator}",
                       f"server.robust.iterations={MAX_ITERATIONS}")
        assert outcome.code == 0 and not outcome.crash, (aggregator, outcome.err[-2000:], outcome.crash)


def test_conflicting_weighting_keys_are_refused_naming_both(tmp_path):
    """`server.weighting: uniform` beside `secagg.weighting: samples` was accepted without saying which applies
    (under secure aggregation secagg.weighting decides each client's weight)."""
    conflict = ("server.secure_aggregation=secagg", "server.weighting=uniform", "secagg.weighting=samples")
    for flag in ("--dry-run", "--overwrite"):
        line = _one_error_line(_run(tmp_path, flag, *conflict))
        assert "server.weighting = 'uniform'" in line and "secagg.weighting = 'samples'" in line, line
    assert not (tmp_path / "run-out").exists()
    # The combinations that agree still run.
    for server, secagg in (("uniform", "uniform"), ("samples", "samples"), ("samples", "uniform")):
        outcome = _run(tmp_path, "--dry-run", "server.secure_aggregation=secagg", f"server.weighting={server}",
                       f"secagg.weighting={secagg}")
        assert outcome.code == 0, (server, secagg, outcome.err[-2000:])


@pytest.mark.parametrize("key, value, context", [
    ("server_data.beta", 1e300, ("server_data.size=10", "server_data.scheme=dirichlet")),
    ("client.lr_schedule.step_rounds", 10 ** 12, ("client.lr_schedule.name=step", "client.lr_schedule.gamma=0.5")),
    ("client.lr_schedule.rounds", 10 ** 12, ("client.lr_schedule.name=cosine",)),
    ("client.compress.levels", 10 ** 12, ("client.compress.name=qsgd",)),
    ("server.tau", 1e7, ("server.optimizer=yogi",)),
])
def test_h07_the_keys_accepted_without_a_word_are_refused_at_dry_run(tmp_path, key, value, context):
    """H07: each was accepted without a word, beside the keys that make it read."""
    line = _one_error_line(_run(tmp_path, "--dry-run", *context, f"{key}={value}"))
    assert line.split("error: ")[-1].startswith(f"{key} = ") and "must be a" in line \
        and (" in [" in line or " in (" in line), line
