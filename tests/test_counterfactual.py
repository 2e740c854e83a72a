"""Counterfactual runs in one process: the section's checks, the plans, the refusals, `fedmpi counterfactual`'s
sets and its packed launch, and the fork's check of where a change starts (the bit-for-bit exactness against the
original at -n 1, 2, 3 is tests/test_counterfactual_mpi.py's)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import small_config, write_config

from fedmpi import config
from fedmpi.cli import main
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError
from fedmpi.counterfactual.plans import DroppedUploads, RemovedClients
from fedmpi.plans.base import Participation
from fedmpi.sweep.counterfactuals import counterfactual_sets, subset_name


class _Algo:
    def select(self, t, standard, sizes):
        return standard

    sizes = ()


def test_the_section_keeps_sorted_ids_and_stays_out_of_the_hash_at_its_defaults():
    plain = config.from_dict({})
    cf = config.from_dict({"counterfactual": {"drop": [3, 1, 3]}})
    assert cf.counterfactual.drop == (1, 3) and cf.counterfactual.change == "drop [1, 3]"
    assert config.from_dict({"counterfactual": {"of": "runs/x", "from_round": 4}}).hash() == plain.hash()
    assert cf.hash() != plain.hash()
    assert cf.hash() == config.from_dict({"counterfactual": {"drop": [1, 3], "of": "elsewhere"}}).hash()


@pytest.mark.parametrize("section, key", [
    ({"drop": [100]}, "counterfactual.drop"),
    ({"drop": [2], "remove": [2]}, "counterfactual.drop"),
    ({"remove": list(range(100))}, "counterfactual.remove"),
    ({"from_round": -1}, "counterfactual.from_round"),
])
def test_bad_keys_are_named(section, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config.from_dict({"partition": {"clients": 100}, "counterfactual": section})


def test_dropped_clients_keep_the_selection_and_do_not_count_from_their_round():
    inner = Participation(_Algo(), seed=4, num_clients=10, clients_per_round=6)
    plans = DroppedUploads(inner, [int(inner.plan(2).selected[0])], from_round=2)
    k = int(inner.plan(2).selected[0])
    for t in range(6):
        plan, original = plans.plan(t), inner.plan(t)
        assert np.array_equal(plan.selected, original.selected)
        assert [plan.counts(c) for c in plan.selected] == [not (t >= 2 and c == k) for c in original.selected]
        assert plans.counted(t, k) == (t < 2)


def test_removed_clients_are_never_drawn_and_the_others_are_drawn_as_before_the_change():
    removed = [0, 5]
    plans = RemovedClients(_Algo(), seed=7, num_clients=12, clients_per_round=5, removed=removed, from_round=3)
    for t in range(40):
        drawn = plans.plan(t).selected
        if t < 3:
            assert np.array_equal(drawn, rng.select_clients(7, t, 12, 5))
        else:
            assert len(drawn) == 5 and not set(drawn.tolist()) & set(removed)


def test_sets_for_each_client_a_list_and_every_subset():
    cfg = {"partition": {"clients": 4}}
    assert counterfactual_sets(cfg, drop_each=True, clients=[1, 3]) == [
        {"name": "drop-1", "counterfactual.drop": [1]}, {"name": "drop-3", "counterfactual.drop": [3]}]
    assert counterfactual_sets(cfg, drop=[2, 0], remove=True) == [
        {"name": "remove-2.0", "counterfactual.remove": [2, 0]}]
    subsets = counterfactual_sets(cfg, subsets="all")
    assert len(subsets) == 2 ** 4 - 1          # every proper subset; the full one is the original
    assert {"name": "keep-none", "counterfactual.drop": [0, 1, 2, 3]} in subsets
    assert {"name": "keep-0.2", "counterfactual.drop": [1, 3]} in subsets
    assert subset_name([0, 1, 2, 3], 4) == "keep-all"


def test_a_subsets_file_lists_one_subset_per_line(tmp_path):
    path = tmp_path / "subsets.txt"
    path.write_text("0, 2\n\n2 0\n1\n")
    sets = counterfactual_sets({"partition": {"clients": 3}}, subsets=str(path))
    assert [s["name"] for s in sets] == ["keep-0.2", "keep-none", "keep-1"]


@pytest.mark.parametrize("argv, message", [
    (["--drop-each"], "holds no run.h5"),
])
def test_a_missing_original_is_one_line_exit_2(tmp_path, capsys, argv, message):
    assert main(["counterfactual", str(tmp_path / "nothing"), "--out", str(tmp_path / "cf"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "cf").exists()


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    base = tmp_path_factory.mktemp("original")
    cfg = small_config(base / "orig", rounds=3, partition={"clients": 6, "scheme": "dirichlet", "beta": 0.5},
                       server={"clients_per_round": 6}, checkpoint={"every": 1, "keep": 10},
                       runtime={"threads": 1, "progress": "off"})
    path = write_config(base / "orig.yaml", cfg)
    assert main(["run", str(path)]) == 0
    return base, path


def _shas(folder):
    with h5py.File(folder / "run.h5", "r", locking=False) as f:
        return f["metrics/model_sha256"][()].astype(str), dict(f.attrs)


def test_the_packed_leave_one_out_forks_each_run_from_the_original(original, tmp_path, capsys):
    base, path = original
    out = tmp_path / "loo"
    code = main(["counterfactual", str(base / "orig"), "--out", str(out), "--drop-each", "--clients", "1,4",
                 "--from-round", "2"])
    assert code == 0, capsys.readouterr().err
    orig, _ = _shas(base / "orig")
    for k in (1, 4):
        shas, attrs = _shas(out / f"drop-{k}")
        assert attrs["counterfactual_change"] == f"drop [{k}] from round 2" and attrs["parent_round"] == 2
        assert attrs["counterfactual_of"] == str(base / "orig")
        assert np.array_equal(shas[:2], orig[:2]) and shas[2] != orig[2]
    # the same counterfactual by hand, run from the start: the fork reused rounds 0-1 and changed nothing else
    assert main(["run", str(path), f"out={tmp_path / 'straight'}", "counterfactual.drop=[4]",
                 "counterfactual.from_round=2"]) == 0
    assert np.array_equal(_shas(tmp_path / "straight")[0], _shas(out / "drop-4")[0])


def test_a_fork_that_says_its_change_starts_before_the_fork_is_refused(original, tmp_path, capsys):
    base, path = original
    code = main(["run", str(path), f"out={tmp_path / 'f'}", "counterfactual.drop=[1]", "--fork-from",
                 f"{base / 'orig'}@2"])
    assert code == 2
    assert "counterfactual.from_round=2" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("extra, words", [
    ({"algorithm": {"name": "fedskip"}}, "routes each model"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 4}}, "simulated arrivals"),
    ({"clients": {"dropout": 0.1}, "counterfactual": {"remove": [1]}}, "use counterfactual.drop"),
])
def test_runs_that_cannot_be_exact_are_refused_naming_why(tmp_path, capsys, extra, words):
    cfg = small_config(tmp_path / "out", rounds=1, **{"counterfactual": {"drop": [1]}, **extra})
    assert main(["run", str(write_config(tmp_path / "c.yaml", cfg)), "--dry-run"]) == 2
    assert words in capsys.readouterr().err


def test_a_sweeps_fork_from_must_name_a_checkpoint(tmp_path, capsys):
    base = write_config(tmp_path / "base.yaml", small_config(tmp_path / "x", rounds=1))
    spec = write_config(tmp_path / "spec.yaml", {"base": str(base), "out": str(tmp_path / "sweep"),
                                                 "sets": [{"name": "a", "client.lr": 0.1}], "fork_from": "runs/x"})
    assert main(["sweep", str(spec), "--dry-run"]) == 2
    assert "fork_from = 'runs/x': must be OLD_OUT@ROUND" in capsys.readouterr().err


def test_the_counterfactuals_of_a_recorded_original_do_not_record_unless_asked(tmp_path):
    from fedmpi.sweep.counterfactuals import spec_for

    assert spec_for("orig", tmp_path, [])["overrides"]["checkpoint.updates"] is False
    assert spec_for("orig", tmp_path, [], record_updates=True)["overrides"]["checkpoint.updates"] is True


def test_a_removed_client_is_never_selected_and_the_run_says_so(original, tmp_path):
    base, path = original
    cfg = small_config(tmp_path / "rm", rounds=4, partition={"clients": 6, "scheme": "dirichlet", "beta": 0.5},
                       server={"clients_per_round": 3}, counterfactual={"remove": [2], "of": str(base / "orig")},
                       runtime={"threads": 1, "progress": "off"})
    assert main(["run", str(write_config(tmp_path / "rm.yaml", cfg))]) == 0
    with h5py.File(tmp_path / "rm" / "run.h5", "r", locking=False) as f:
        selected = f["clients/selected"][()]
        assert f.attrs["counterfactual_change"] == "remove [2]"
    assert selected.shape == (4, 3) and 2 not in selected         # each round's three ids, none of them client 2
