"""Issue 38, item 2: every recorded figure is right or absent. A run whose evaluation would read an empty
set is refused at set-up naming the key, instead of recording test accuracy 0 and loss 0 every round."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_config, write_config

from fedmpi.cli import main


def arrays_file(path, train, test, classes=None):
    g = np.random.default_rng(0)
    y_test = np.arange(test) % 2 if classes is None else np.full(test, classes)
    np.savez(path, x_train=g.random((train, 4)).astype(np.float32), y_train=np.arange(train) % 2,
             x_test=g.random((test, 4)).astype(np.float32), y_test=y_test, num_classes=np.array(3))
    return path


@pytest.mark.parametrize("train, test, extra, part", [(40, 0, {}, "test"), (0, 10, {}, "training"),
                                                      (40, 10, {"classes": 2}, "test")])
def test_an_empty_evaluation_or_training_set_is_refused_naming_the_key(tmp_path, capsys, train, test, extra, part):
    # the third case: every test label is 2, and data.classes = 2 keeps labels 0 and 1 only
    root = arrays_file(tmp_path / "d.npz", train, test, classes=2 if extra else None)
    cfg = small_config(tmp_path / "out", data={"name": "arrays", "root": str(root), **extra},
                       partition={"clients": 4, "scheme": "iid"}, server={"clients_per_round": 2})
    path = write_config(tmp_path / "c.yaml", cfg)
    for mode in (["--dry-run"], []):
        assert main(["run", str(path), *mode]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("data: loading")]
        assert len(err) == 1 and "data.root" in err[0] and f"the {part} set is empty" in err[0], err
    assert not (tmp_path / "out").exists()


# --- a fork that turns a mechanism on: epsilon covers exactly the rounds that had it ----------------------

DP = {"privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0, "delta": 1e-3}}
SECAGG = {"server": {"clients_per_round": 4, "secure_aggregation": "secagg"},
          "secagg": {"bits": 40, "clip": 2.0, "scale": 100000.0, "noise": "skellam", "noise_multiplier": 0.5,
                     "delta": 0.01}}
MECHANISMS = {"privacy": DP, "secagg": SECAGG}


def _run_attrs(out):
    import h5py

    with h5py.File(out / "run.h5", "r", locking=False) as f:
        return dict(f.attrs), f["metrics/epsilon"][()] if "epsilon" in f["metrics"] else None


def _fork_case(tmp_path, sections, parent_sections, rounds=6, at=2):
    base = small_config(tmp_path / "parent", rounds=rounds, data={"name": "synthetic"},
                        partition={"clients": 8, "scheme": "iid"}, server={"clients_per_round": 4},
                        checkpoint={"every": at, "keep": 5})
    parent = write_config(tmp_path / "parent.yaml", {**base, **parent_sections})
    assert main(["run", str(parent)]) == 0
    child = write_config(tmp_path / "child.yaml", {**base, **sections, "out": str(tmp_path / "child")})
    assert main(["run", str(child), "--fork-from", f"{tmp_path / 'parent'}@{at}"]) == 0
    fresh = write_config(tmp_path / "fresh.yaml", {**base, **sections, "rounds": rounds - at,
                                                   "out": str(tmp_path / "fresh")})
    assert main(["run", str(fresh)]) == 0
    return _run_attrs(tmp_path / "child"), _run_attrs(tmp_path / "fresh")


@pytest.mark.parametrize("prefix", sorted(MECHANISMS))
def test_a_fork_turning_a_mechanism_on_records_an_unbounded_epsilon_and_says_why(tmp_path, prefix):
    pytest.importorskip("dp_accounting")
    from fuzz_support import release_claims

    try:
        (attrs, eps), (fresh_attrs, fresh_eps) = _fork_case(tmp_path, MECHANISMS[prefix], {})
    finally:
        release_claims()
    assert attrs[f"{prefix}_epsilon"] == np.inf and "without this mechanism" in attrs[f"{prefix}_epsilon_note"]
    # the noised rounds 3..6 alone: what a fresh run of those 4 rounds with the same noise reaches
    assert attrs[f"{prefix}_epsilon_rounds"] == pytest.approx(fresh_attrs[f"{prefix}_epsilon"], rel=1e-12)
    np.testing.assert_allclose(eps[2:], fresh_eps, rtol=1e-12)


def test_a_fork_of_a_parent_that_ran_the_mechanism_keeps_the_whole_runs_epsilon(tmp_path):
    pytest.importorskip("dp_accounting")
    from fuzz_support import release_claims

    try:
        (attrs, eps), _ = _fork_case(tmp_path, DP, DP)
    finally:
        release_claims()
    parent, parent_eps = _run_attrs(tmp_path / "parent")
    assert np.isfinite(attrs["privacy_epsilon"]) and attrs["privacy_epsilon"] == parent["privacy_epsilon"]
    assert "privacy_epsilon_note" not in attrs
    np.testing.assert_array_equal(eps, parent_eps)


# --- an attack that selects no client ---------------------------------------------------------------------

def test_an_attack_that_selects_no_client_is_warned_about_in_the_log_and_in_run_h5(tmp_path, capsys):
    import h5py

    cfg = small_config(tmp_path / "out", rounds=1, attack={"name": "sign_flip", "fraction": 0.01})   # 0.12 of 12
    assert main(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedmpi: warning:")]
    assert len(warned) == 1 and "attack.fraction = 0.01" in warned[0] and "0 malicious clients" in warned[0]
    with h5py.File(tmp_path / "out" / "run.h5", "r") as f:
        assert "attack-free" in f.attrs["attack_note"] and "1 / 12" in f.attrs["attack_note"]
    cfg.update(out=str(tmp_path / "one"), attack={"name": "sign_flip", "fraction": 1 / 12})   # the fraction named
    assert main(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == 0
    assert "fedmpi: warning" not in capsys.readouterr().err
    with h5py.File(tmp_path / "one" / "run.h5", "r") as f:
        assert "attack_note" not in f.attrs
