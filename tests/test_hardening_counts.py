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
