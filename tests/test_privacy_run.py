"""Client-level DP in the round loop (issue 16, phase 2): the config's hash, the checks, clipping and noise
against hand computations, epsilon against the accountant library's direct call, the algorithms that run
under DP, and the report tool (docs/how-to/privacy.md). Under mpiexec, -n invariance and resume:
tests/test_privacy_mpi.py."""

from __future__ import annotations

import copy
import hashlib
import math
import os
import sys

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, same, write_config

import fedmpi
from fedmpi import config
from fedmpi.cli import main
from fedmpi.core import rng
from fedmpi.mpi.local import LocalComm
from fedmpi.privacy import accounting, mechanism
from fedmpi.privacy.accounting import Sampling
from fedmpi.run.setup import experiment

dpa = pytest.importorskip("dp_accounting", reason="needs dp-accounting (pip install 'fedmpi[privacy]')")

DELTA = 1e-3


def base_config(**sections):
    """Three clients of mnist5k, all selected (fixed sampling): small enough to recompute by hand."""
    cfg = {"seed": 4, "rounds": 1, "out": "unused",
           "data": {"name": "mnist5k"},
           "partition": {"clients": 3, "scheme": "dirichlet", "beta": 0.5},
           "model": {"name": "lr"},
           "client": {"lr": 0.05, "batch_size": 50, "steps": 4, "vectorize": "off"},
           "server": {"clients_per_round": 3},
           "algorithm": {"name": "fedavg"},
           "runtime": {"threads": 1, "progress": "off"}}
    cfg.update(copy.deepcopy(sections))
    return cfg


def with_privacy(cfg, **keys):
    cfg = copy.deepcopy(cfg)
    cfg["privacy"] = {"mechanism": "gaussian", "delta": DELTA, **keys}
    return cfg


def trained_deltas(cfg):
    """Each client's round-0 update Delta_i = y_i - x_0, trained by the real client code (no DP)."""
    cfg = config.from_dict({k: v for k, v in cfg.items() if k != "privacy"})
    exp = experiment(cfg, LocalComm())
    x0 = exp.server.x.clone()
    standard = exp.participation.plan(0).standard
    deltas = []
    for cid in range(cfg.partition.clients):
        exp.clients.train_one(0, cid, standard, lambda run: exp.algo.client_start(run, x0, exp.clients.flat))
        deltas.append((exp.clients.flat.vec - x0).double().clone())
    return x0.double(), deltas


def round_noise(seed, t, dim, std):
    """The spec of the update noise: N(0, std^2) in float64 from torch.Generator(rng.torch_seed(seed, PRIVACY, t))."""
    g = torch.Generator().manual_seed(rng.torch_seed(seed, rng.PRIVACY, t))
    return torch.randn(dim, generator=g, dtype=torch.float64) * std


def direct_epsilons(rounds, sampling, z, delta):
    """Epsilon after each round from the library itself, one accountant per round count."""
    out = []
    for t in range(1, rounds + 1):
        if sampling.kind == "poisson":
            acc = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
            acc.compose(dpa.PoissonSampledDpEvent(sampling.rate, dpa.GaussianDpEvent(z)), t)
        else:
            acc = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
            acc.compose(dpa.SampledWithoutReplacementDpEvent(sampling.num_clients, sampling.per_round,
                                                             dpa.GaussianDpEvent(z / 2)), t)
        out.append(acc.get_epsilon(delta))
    return np.array(out)


# --- the config's hash -----------------------------------------------------------------------------


def pre_wave_hash(mapping):
    """Config.hash as it was before this wave's keys existed: the same dict without them (they are at their
    defaults in `mapping`) and without the run-time keys."""
    d = {k: v for k, v in config.from_dict(mapping).to_dict().items()
         if k not in ("rounds", "checkpoint", "runtime", "out")}
    for dotted in config.HASH_OPTIONAL + ("server.trains_clients",):
        *parents, leaf = dotted.split(".")
        node = d
        for part in parents:
            node = node[part]
        del node[leaf]
    return hashlib.sha256(yaml.safe_dump(d, sort_keys=True).encode()).hexdigest()[:16]


def test_runs_without_dp_keep_their_hash_and_dp_changes_it():
    plain = base_config()
    off = dict(plain, privacy={"mechanism": "none", "clip": 0.3, "adaptive_clip": True})
    fixed = dict(plain, server={"clients_per_round": 3, "sampling": "fixed"})
    h = config.from_dict(plain).hash()
    assert h == pre_wave_hash(plain) == config.from_dict(off).hash() == config.from_dict(fixed).hash()
    on = config.from_dict(with_privacy(plain)).hash()
    poisson = config.from_dict(dict(plain, server={"clients_per_round": 3, "sampling": "poisson"})).hash()
    assert len({h, on, poisson}) == 3
    assert on != config.from_dict(with_privacy(plain, clip=0.3)).hash()


def test_sampling_key_is_validated_with_its_name():
    with pytest.raises(config.ConfigError, match=r"server.sampling = 'bernoulli': must be one of fixed, poisson"):
        config.from_dict({"server": {"sampling": "bernoulli"}})


# --- mechanism off: nothing changes ------------------------------------------------------------------


def test_mechanism_none_is_bit_identical_to_no_section():
    plain = base_config(rounds=3, partition={"clients": 6, "scheme": "dirichlet", "beta": 0.5},
                        server={"clients_per_round": 4}, client={"lr": 0.05, "batch_size": 20, "epochs": 1})
    off = dict(plain, privacy={"mechanism": "none", "clip": 0.01, "noise_multiplier": 5.0, "adaptive_clip": True})
    a, b = fedmpi.simulate(plain), fedmpi.simulate(off)
    assert np.array_equal(a.model, b.model)
    assert sorted(a.metrics) == sorted(b.metrics) and "epsilon" not in b.metrics
    for name in a.metrics:
        if name != "wall_s":
            assert same(a.metrics[name], b.metrics[name]), name
    assert b.experiment.stages == [] and b.experiment.wire.header_len == 2


# --- clipping and noise against hand computations ---------------------------------------------------


@pytest.mark.parametrize("adaptive", [False, True])
def test_one_round_matches_the_hand_computation(adaptive):
    cfg = base_config()
    x0, deltas = trained_deltas(cfg)
    norms = sorted(float(torch.linalg.vector_norm(d)) for d in deltas)
    clip = (norms[0] + norms[1]) / 2          # one update within the bound, two clipped
    z, sigma_b, gamma, eta = 0.7, 1.0, 0.5, 0.2
    keys = {"clip": clip, "noise_multiplier": z}
    if adaptive:
        keys.update(adaptive_clip=True, clip_count_stddev=sigma_b, target_quantile=gamma, clip_lr=eta)
    result = fedmpi.simulate(with_privacy(cfg, **keys))

    # float32 as every rank receives it; the fixed clip is the config's float
    c = float(np.float32(clip)) if adaptive else clip
    clipped = [d * min(1.0, c / float(torch.linalg.vector_norm(d))) for d in deltas]
    z_update = (z ** -2 - (2 * sigma_b) ** -2) ** -0.5 if adaptive else z
    expected_size = 3.0                          # fixed-size sampling: S
    update = (sum(clipped) + round_noise(cfg["seed"], 0, len(x0), z_update * c)) / expected_size
    np.testing.assert_allclose(result.model, (x0 + update).numpy(), rtol=0, atol=2e-6)
    # the noise is far larger than the tolerance: a wrong stream or scale would show
    assert float((update - sum(clipped) / expected_size).abs().max()) > 1e-3

    m = result.metrics
    assert m["dp_clipped_fraction"][0] == pytest.approx(2 / 3) and m["dp_clip"][0] == c
    assert result.clients["selected"][0].sum() == 3 and m["uploads"][0] == 3
    if adaptive:
        reports = sum(0.5 if n <= c else -0.5 for n in norms)            # b_i - 1/2
        noise_b = sigma_b * rng.stream(cfg["seed"], rng.PRIVACY, 0, 1).standard_normal()
        b_hat = min(1.0, max(0.0, (reports + noise_b) / expected_size + 0.5))
        assert m["dp_unclipped_estimate"][0] == pytest.approx(b_hat, abs=1e-12)
        assert result.experiment.stages[0].estimator.clip == pytest.approx(clip * math.exp(-eta * (b_hat - gamma)),
                                                                           rel=1e-12)
    else:
        assert "dp_unclipped_estimate" not in m


def test_an_empty_poisson_round_still_adds_the_noise():
    # a seed whose round-0 Poisson draw (q = 1/6) is empty: found, not assumed
    seed = next(s for s in range(200) if len(mechanism.poisson_select(s, 0, 6, 1 / 6)) == 0)
    cfg = base_config(seed=seed, partition={"clients": 6, "scheme": "dirichlet", "beta": 0.5},
                      server={"clients_per_round": 1, "sampling": "poisson"})
    z, clip = 1.3, 0.2
    result = fedmpi.simulate(with_privacy(cfg, clip=clip, noise_multiplier=z, delta=0.01))
    x0 = experiment(config.from_dict(cfg), LocalComm()).server.x.double()
    assert result.metrics["uploads"][0] == 0 and result.clients["selected"][0].sum() == 0
    expected = x0 + round_noise(seed, 0, len(x0), z * clip) / 1.0      # expected cohort q N = 1
    np.testing.assert_allclose(result.model, expected.numpy(), rtol=0, atol=1e-6)
    assert math.isnan(result.metrics["dp_clipped_fraction"][0]) and result.metrics["epsilon"][0] > 0


def test_poisson_cohorts_are_the_seeded_draw():
    cfg = base_config(rounds=6, seed=2, partition={"clients": 10, "scheme": "iid"},
                      server={"clients_per_round": 3, "sampling": "poisson"},
                      client={"lr": 0.05, "batch_size": 50, "steps": 1})
    result = fedmpi.simulate(cfg)         # Poisson sampling needs no privacy
    for t in range(6):
        chosen = mechanism.poisson_select(2, t, 10, 0.3)
        assert np.array_equal(np.flatnonzero(result.clients["selected"][t]), chosen)
        assert result.metrics["uploads"][t] == len(chosen)
    sizes = result.clients["selected"].sum(axis=1)
    assert len(set(sizes.tolist())) > 1       # not a fixed-size draw


# --- epsilon ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_epsilon_metric_is_the_librarys_direct_answer(sampling):
    cfg = base_config(rounds=5, partition={"clients": 10, "scheme": "iid"},
                      server={"clients_per_round": 4, "sampling": sampling},
                      client={"lr": 0.05, "batch_size": 50, "steps": 1})
    z = 1.1
    result = fedmpi.simulate(with_privacy(cfg, noise_multiplier=z))
    expected = direct_epsilons(5, Sampling(sampling, 10, 4), z, DELTA)
    np.testing.assert_array_equal(result.metrics["epsilon"], expected)
    attrs = result.experiment.run_attrs()
    assert attrs["privacy_noise_multiplier"] == z and attrs["privacy_epsilon"] == expected[-1]


def test_target_epsilon_picks_the_noise_before_the_run():
    cfg = base_config(rounds=6, partition={"clients": 10, "scheme": "iid"},
                      server={"clients_per_round": 4, "sampling": "poisson"},
                      client={"lr": 0.05, "batch_size": 50, "steps": 1})
    result = fedmpi.simulate(with_privacy(cfg, target_epsilon=4.0))
    z = result.experiment.run_attrs()["privacy_noise_multiplier"]
    sampling = Sampling("poisson", 10, 4)
    assert z == accounting.noise_for_epsilon(4.0, 6, DELTA, sampling)
    eps = result.metrics["epsilon"]
    assert eps[-1] <= 4.0 and eps[-1] > 3.95 and np.all(np.diff(eps) > 0)
    np.testing.assert_array_equal(eps, direct_epsilons(6, sampling, z, DELTA))


def test_dry_run_prints_the_epsilon_the_run_will_reach(tmp_path, capsys):
    cfg = base_config(rounds=40, partition={"clients": 10, "scheme": "iid"},
                      server={"clients_per_round": 4, "sampling": "poisson"}, out=str(tmp_path / "out"))
    path = write_config(tmp_path / "c.yaml", with_privacy(cfg, noise_multiplier=1.5))
    assert main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    eps = direct_epsilons(40, Sampling("poisson", 10, 4), 1.5, DELTA)[-1]
    assert f"epsilon after 40 rounds = {eps:.4g} at delta = {DELTA:g} (rdp)" in out
    assert "Poisson sampling q = 0.4" in out and not (tmp_path / "out").exists()


# --- which algorithms run -----------------------------------------------------------------------------


REFUSED = {
    "scaffold": ({"name": "scaffold"}, {}, "control-variate change"),
    "fedskip": ({"name": "fedskip"}, {}, "slots carry"),
    "safl gated": ({"name": "safl", "gating": True}, {}, "probe-accuracy gap"),
    "safl ida": ({"name": "safl", "fusion": "ida"}, {}, "IDA fusion"),
    "fednova epochs": ({"name": "fednova"}, {"client": {"lr": 0.05, "batch_size": 50, "epochs": 1}}, "client.steps"),
    "central": ({"name": "central"}, {}, "per-example DP-SGD"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_algorithms_that_are_not_dp_are_refused_with_the_reason(case):
    algorithm, extra, reason = REFUSED[case]
    cfg = with_privacy(base_config(algorithm=algorithm, **extra))
    with pytest.raises(config.ConfigError, match=reason) as info:
        fedmpi.simulate(cfg)
    assert info.value.exit_code == 2 and "docs/how-to/privacy.md" in str(info.value)


def test_a_refused_run_exits_2_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    path = write_config(tmp_path / "c.yaml", with_privacy(base_config(algorithm={"name": "scaffold"}, out=str(out))))
    assert main(["run", str(path)]) == 2
    assert "not differentially private" in capsys.readouterr().err
    assert not out.exists() or sorted(os.listdir(out)) == [".fedmpi.lock"]     # out is claimed first, nothing more
    assert main(["run", str(path), "--dry-run"]) == 2


def test_poisson_sampling_refuses_fixed_size_algorithms():
    cfg = base_config(algorithm={"name": "fedskip"}, server={"clients_per_round": 3, "sampling": "poisson"})
    with pytest.raises(config.ConfigError, match="server.sampling = 'poisson' with algorithm.name = 'fedskip'"):
        fedmpi.simulate(cfg)


ALLOWED = {
    "fedprox": ({"name": "fedprox", "mu": 0.1}, {}),
    "moon": ({"name": "moon"}, {"model": {"name": "simple_cnn", "projection": 16}}),
    "fsl": ({"name": "fsl"}, {"server_data": {"size": 200}}),
    "fsl parallel": ({"name": "fsl", "mode": "parallel"}, {"server_data": {"size": 200}}),
    "datashare": ({"name": "datashare"}, {"server_data": {"size": 200}}),
    "feddyn": ({"name": "feddyn"}, {}),
    "safl": ({"name": "safl"}, {}),
    "fedavg adam": ({"name": "fedavg"}, {"server": {"clients_per_round": 2, "optimizer": "adam", "lr": 0.01}}),
    "fedavg avgm": ({"name": "fedavg"}, {"server": {"clients_per_round": 2, "optimizer": "avgm", "lr": 0.5}}),
}


@pytest.mark.parametrize("case", list(ALLOWED))
def test_reduce_algorithms_and_server_optimizers_run_with_clipped_uniform_uploads(case, monkeypatch):
    algorithm, extra = ALLOWED[case]
    cfg = with_privacy(base_config(rounds=2, algorithm=algorithm, **extra), clip=0.05, noise_multiplier=0.5)
    seen = []
    from fedmpi.privacy.stage import PrivacyStage

    original = PrivacyStage.client

    def spy(self, update, view):
        out = original(self, update, view)
        seen.append((out.weight, float(torch.linalg.vector_norm(out.vector - out.start))))
        return out

    monkeypatch.setattr(PrivacyStage, "client", spy)
    result = fedmpi.simulate(cfg)
    assert len(seen) == 2 * result.experiment.cfg.server.clients_per_round
    for weight, norm in seen:      # what accumulate reads: weight 1, norm within C (float32 rounding)
        assert weight == 1.0 and norm <= 0.05 * (1 + 1e-5)
    assert np.all(np.isfinite(result.model)) and len(result.metrics["epsilon"]) == 2


def test_fednova_with_steps_is_dp_fedavg():
    # Every a_i is the same public a: FedNova's update equals FedAvg's, and under DP it is taken as such.
    cfg = with_privacy(base_config(rounds=2, client={"lr": 0.05, "batch_size": 20, "steps": 5, "momentum": 0.5}),
                       clip=0.05, noise_multiplier=0.8)
    nova = fedmpi.simulate(dict(cfg, algorithm={"name": "fednova"}))
    avg = fedmpi.simulate(cfg)
    assert np.array_equal(nova.model, avg.model)


def test_safl_under_dp_takes_uniform_weights():
    # eps = 1 makes SAFL's start point the global model: with uniform weights it is DP-FedAvg exactly.
    cfg = with_privacy(base_config(rounds=2), clip=0.05, noise_multiplier=0.8)
    safl = fedmpi.simulate(dict(cfg, algorithm={"name": "safl", "eps": 1.0}))
    avg = fedmpi.simulate(cfg)
    assert np.array_equal(safl.model, avg.model)


# --- the report tool --------------------------------------------------------------------------------


def test_privacy_report_configs_validate_and_its_section_is_replaced_in_place(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import privacy_report
    finally:
        sys.path.remove(str(ROOT / "tools"))
    args = privacy_report.parse(["--runs", str(tmp_path / "runs"), "--docs", str(tmp_path / "docs"), "--seeds", "0"])
    paths = privacy_report.write_configs(args)
    assert len(paths) == len(privacy_report.METHODS) * len(privacy_report.EPSILONS)
    for path in paths:
        cfg = config.load(path)
        assert cfg.server.sampling == "poisson" and cfg.partition.clients >= 100
        finite = not path.endswith("-epsinf.yaml")
        assert cfg.privacy.enabled == finite
        if finite:
            assert cfg.privacy.target_epsilon in privacy_report.EPSILONS
    doc = tmp_path / "privacy.md"
    doc.write_text("intro\n")
    privacy_report.write_section(doc, f"{privacy_report.BEGIN}\nfirst\n{privacy_report.END}")
    doc.write_text(doc.read_text() + "\n## After\nkept\n")
    privacy_report.write_section(doc, f"{privacy_report.BEGIN}\nsecond\n{privacy_report.END}")
    text = doc.read_text()
    assert "second" in text and "first" not in text and text.startswith("intro\n") and text.endswith("kept\n")
    assert text.count(privacy_report.BEGIN) == 1
