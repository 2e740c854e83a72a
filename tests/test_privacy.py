"""Client-level DP (issue 16): the config section, clipping, the (seed, round) noise, DP-FedAvg's average,
Poisson sampling and adaptive clipping. The accounting against Google's dp-accounting and TF Privacy's
published table, and the plan's cross-section checks, are tests/test_privacy_accounting.py."""

import math

import numpy as np
import pytest
import torch
from conftest import tool_module

from fedmpi import config
from fedmpi.core import rng
from fedmpi.core.errors import EXIT_USAGE, ConfigError, InputError
from fedmpi.privacy import mechanism
from fedmpi.privacy.accounting import Sampling
from fedmpi.privacy.keys import PrivacyConfig

try:
    import dp_accounting as dpa
except ImportError:     # the accounting tests need the `privacy` extra; the mechanism tests do not
    dpa = None

NEEDS_DPA = pytest.mark.skipif(dpa is None, reason="needs dp-accounting (pip install 'fedmpi[privacy]')")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
POISSON = Sampling("poisson", 100, 10)     # q = 0.1


# --- config section ------------------------------------------------------------------------------


def test_defaults_are_valid_and_off():
    cfg = PrivacyConfig()
    assert not cfg.enabled and cfg.clip == 1.0 and cfg.accountant == "rdp" and cfg.target_quantile == 0.5
    assert PrivacyConfig(mechanism="gaussian").enabled


def test_every_bad_value_is_reported_at_once_with_its_key():
    with pytest.raises(ConfigError) as info:
        PrivacyConfig(mechanism="laplace", clip=0.0, noise_multiplier=-1.0, delta=1.0, target_epsilon=0.0,
                      accountant="moments", target_quantile=1.0, clip_lr=0.0, clip_count_stddev=-2.0,
                      adaptive_clip="yes")
    keys = [m.split(" = ")[0] for m in info.value.messages]
    assert sorted(keys) == sorted(f"privacy.{k}" for k in (
        "mechanism", "clip", "noise_multiplier", "delta", "target_epsilon", "accountant", "target_quantile",
        "clip_lr", "clip_count_stddev", "adaptive_clip"))
    assert info.value.exit_code == EXIT_USAGE


def test_a_wrong_type_is_a_config_error_not_a_traceback():
    with pytest.raises(ConfigError,
                       match=r"privacy.target_epsilon = 'eight': must be a number in \[0.01, 1000\] or null"):
        PrivacyConfig(target_epsilon="eight")


def test_every_field_has_a_docstring():
    """The reference's own reader of field docstrings (tools/docs_reference.py), on the privacy section."""
    docs = tool_module("docs_reference", "privacy").field_docs(PrivacyConfig)
    assert docs and all(doc.strip() for doc in docs.values()), [name for name, doc in docs.items() if not doc]


def test_the_config_loader_builds_the_section():
    errors = []
    built = config._build(PrivacyConfig, {"mechanism": "gaussian", "clip": 2, "target_epsilon": 8}, "privacy",
                          errors)
    assert errors == [] and built == PrivacyConfig(mechanism="gaussian", clip=2.0, target_epsilon=8.0)
    config._build(PrivacyConfig, {"clp": 1.0, "accountant": "moments"}, "privacy", errors)
    assert any("privacy.clp" in e and "'clip'" in e for e in errors)
    assert any(e.startswith("privacy.accountant = 'moments'") for e in errors)


# --- clipping ------------------------------------------------------------------------------------


def test_clip_scales_to_the_bound_and_returns_the_prior_norm():
    delta = torch.tensor([3.0, 4.0, 0.0, 0.0])
    storage = delta.data_ptr()
    assert mechanism.clip_update_(delta, 1.0) == pytest.approx(5.0)
    assert delta.tolist() == pytest.approx([0.6, 0.8, 0.0, 0.0]) and delta.data_ptr() == storage


@pytest.mark.parametrize("clip", [5.0, 10.0])
def test_clip_is_a_no_op_at_or_below_the_bound(clip):
    delta = torch.tensor([3.0, 4.0])
    assert mechanism.clip_update_(delta, clip) == pytest.approx(5.0)
    assert delta.tolist() == [3.0, 4.0]


def test_clip_keeps_the_direction_of_a_large_vector():
    delta = torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 3
    before = delta.clone()
    norm = mechanism.clip_update_(delta, 0.5)
    assert norm == pytest.approx(float(before.double().norm()), rel=1e-6)
    assert float(delta.double().norm()) == pytest.approx(0.5, rel=1e-6)
    assert torch.allclose(delta, before * (0.5 / norm), rtol=1e-6, atol=0)


def test_a_non_finite_update_is_zeroed():
    delta = torch.tensor([1.0, float("nan"), 2.0])
    assert math.isnan(mechanism.clip_update_(delta, 1.0))
    assert delta.tolist() == [0.0, 0.0, 0.0]


@CUDA
def test_clip_on_cuda_matches_the_cpu():
    delta = torch.randn(10_000, generator=torch.Generator().manual_seed(1))
    on_gpu = delta.cuda()
    assert mechanism.clip_update_(on_gpu, 1.0) == pytest.approx(mechanism.clip_update_(delta, 1.0), rel=1e-6)
    assert torch.allclose(on_gpu.cpu(), delta, rtol=1e-5, atol=1e-8)


# --- noise ---------------------------------------------------------------------------------------


def test_noise_depends_only_on_seed_and_round():
    a = mechanism.gaussian_noise(1000, 2.0, seed=7, round_=3, dtype=torch.float64)
    assert torch.equal(a, mechanism.gaussian_noise(1000, 2.0, seed=7, round_=3, dtype=torch.float64))
    assert not torch.equal(a, mechanism.gaussian_noise(1000, 2.0, seed=7, round_=4, dtype=torch.float64))
    assert not torch.equal(a, mechanism.gaussian_noise(1000, 2.0, seed=8, round_=3, dtype=torch.float64))
    # float32 is the float64 draw rounded, not another draw; std only scales
    assert torch.equal(mechanism.gaussian_noise(1000, 2.0, 7, 3), a.float())
    assert torch.allclose(mechanism.gaussian_noise(1000, 1.0, 7, 3, dtype=torch.float64) * 2.0, a, rtol=1e-15, atol=0)


def test_noise_does_not_depend_on_the_default_torch_generator():
    torch.manual_seed(0)
    a = mechanism.gaussian_noise(64, 1.0, 1, 1)
    torch.manual_seed(123)
    torch.randn(5)
    assert torch.equal(a, mechanism.gaussian_noise(64, 1.0, 1, 1))


@CUDA
def test_noise_on_cuda_is_the_same_vector():
    cpu = mechanism.gaussian_noise(4096, 0.7, 5, 9)
    gpu = mechanism.gaussian_noise(4096, 0.7, 5, 9, device="cuda")
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)


def test_noise_mean_and_std_within_statistical_bounds():
    n, std = 1_000_000, 2.5
    x = mechanism.gaussian_noise(n, std, seed=0, round_=1, dtype=torch.float64)
    # 5 standard errors: mean's se = std / sqrt(n); the sample std's se is about std / sqrt(2 n)
    assert abs(float(x.mean())) < 5 * std / math.sqrt(n)
    assert abs(float(x.std()) - std) < 5 * std / math.sqrt(2 * n)


def test_add_noise_adds_the_rounds_vector_in_place_once():
    summed = torch.arange(6, dtype=torch.float64)
    mechanism.add_noise_(summed, 0.3, seed=2, round_=5)
    expected = torch.arange(6, dtype=torch.float64) + mechanism.gaussian_noise(6, 0.3, 2, 5, dtype=torch.float64)
    assert torch.equal(summed, expected)
    untouched = torch.ones(3)
    assert torch.equal(mechanism.add_noise_(untouched, 0.0, 2, 5), torch.ones(3))


# --- DP-FedAvg average ---------------------------------------------------------------------------


def test_dp_fedavg_divides_the_sum_of_clipped_updates_by_the_expected_size():
    updates = [torch.tensor([3.0, 4.0]), torch.tensor([0.3, 0.0]), torch.tensor([0.0, -8.0])]
    for u in updates:
        mechanism.clip_update_(u, 1.0)       # [0.6, 0.8], [0.3, 0], [0, -1]
    summed = sum(updates)                    # [0.9, -0.2]
    q, n_clients = 0.2, 10                   # expected cohort q N = 2, although 3 took part
    average = mechanism.dp_fedavg_average(summed, q * n_clients)
    assert average.tolist() == pytest.approx([0.45, -0.1])
    with pytest.raises(ValueError):
        mechanism.dp_fedavg_average(summed, 0)


# --- Poisson sampling ----------------------------------------------------------------------------


def test_poisson_selection_is_reproducible_sorted_and_keyed_by_round():
    a = mechanism.poisson_select(3, 10, 200, 0.1)
    assert np.array_equal(a, mechanism.poisson_select(3, 10, 200, 0.1))
    assert np.array_equal(a, np.unique(a)) and a.min() >= 0 and a.max() < 200
    assert not np.array_equal(a, mechanism.poisson_select(3, 11, 200, 0.1))
    assert not np.array_equal(a, mechanism.poisson_select(4, 10, 200, 0.1))
    assert len(mechanism.poisson_select(3, 10, 50, 0.0)) == 0
    assert np.array_equal(mechanism.poisson_select(3, 10, 50, 1.0), np.arange(50))
    with pytest.raises(ValueError):
        mechanism.poisson_select(3, 10, 50, 1.5)


def test_poisson_rate_within_bounds_overall_and_per_client():
    n, q, rounds = 100, 0.1, 2000
    hits = np.zeros(n)
    sizes = []
    for t in range(rounds):
        chosen = mechanism.poisson_select(0, t, n, q)
        hits[chosen] += 1
        sizes.append(len(chosen))
    total = n * rounds
    assert abs(sum(sizes) - q * total) < 5 * math.sqrt(total * q * (1 - q))
    assert np.abs(hits / rounds - q).max() < 5 * math.sqrt(q * (1 - q) / rounds)
    assert np.std(sizes) > 0                       # the cohort size varies, unlike fixed-size sampling
    assert mechanism.poisson_rate(10, 100) == q


# --- adaptive clipping ---------------------------------------------------------------------------


def test_adaptive_clip_three_rounds_by_hand():
    clip = mechanism.AdaptiveClip(1.0, target_quantile=0.5, lr=0.2, count_stddev=0.5, expected_size=4)
    # round 1: norms vs C = 1 -> b = 1, 0, 1, 0; centred sum 0; with noise +0.4: b_hat = 0.4/4 + 0.5 = 0.6
    reports = [clip.indicator(v) for v in (0.5, 2.0, 0.9, 3.0)]
    assert reports == [0.5, -0.5, 0.5, -0.5]
    assert clip.update(sum(reports) + 0.4) == pytest.approx(0.6)
    assert clip.clip == pytest.approx(math.exp(-0.02))                        # 0.98019867
    # round 2: vs C = 0.9802 -> b = 1, 1, 0, 0; noise -2.4: b_hat = -0.1 clamped to 0; C *= exp(0.1)
    reports = [clip.indicator(v) for v in (0.5, 0.97, 0.99, 3.0)]
    assert reports == [0.5, 0.5, -0.5, -0.5]
    assert clip.update(sum(reports) - 2.4) == 0.0
    assert clip.clip == pytest.approx(math.exp(0.08))                         # 1.08328707
    # round 3: everything within C, no noise: b_hat = 2/4 + 0.5 = 1; C *= exp(-0.1)
    reports = [clip.indicator(v) for v in (0.1, 0.2, 1.0, 1.08)]
    assert clip.update(sum(reports)) == 1.0
    assert clip.clip == pytest.approx(math.exp(-0.02))


def test_adaptive_clip_noise_comes_from_the_count_stream():
    a = mechanism.AdaptiveClip(1.0, 0.5, 0.2, count_stddev=1.5, expected_size=10)
    b = mechanism.AdaptiveClip(1.0, 0.5, 0.2, count_stddev=1.5, expected_size=10)
    draw = float(rng.stream(4, rng.PRIVACY, 7, mechanism.COUNT_KEY).standard_normal())
    assert a.step(1.0, seed=4, round_=7) == b.update(1.0 + 1.5 * draw)
    assert a.clip == b.clip
    assert a.count_noise(4, 7) != a.count_noise(4, 8)


def test_adaptive_clip_state_round_trips_and_rejects_garbage():
    a = mechanism.AdaptiveClip(1.0, 0.5, 0.2, 0.5, 10)
    a.update(3.0)
    state = a.state()
    assert set(state) == {"clip"} and state["clip"].dtype == np.float64
    b = mechanism.AdaptiveClip(1.0, 0.5, 0.2, 0.5, 10)
    b.load_state(state)
    assert b.clip == a.clip
    for bad in ({}, {"clip": np.array([-1.0])}, {"clip": np.array([1.0, 2.0])}, {"clip": np.array([np.nan])}):
        with pytest.raises(InputError, match="clip"):
            b.load_state(bad)


def test_adjusted_noise_multiplier_by_hand_and_its_limits():
    assert mechanism.adjusted_noise_multiplier(1.0, 1.0) == pytest.approx(1 / math.sqrt(0.75))
    assert mechanism.adjusted_noise_multiplier(0.0, 1.0) == 0.0
    with pytest.raises(ConfigError, match="privacy.clip_count_stddev"):
        mechanism.adjusted_noise_multiplier(1.0, 0.5)
    assert mechanism.default_count_stddev(40) == 2.0


@NEEDS_DPA
def test_update_and_count_together_cost_exactly_one_gaussian_of_z():
    z, sigma_b = 1.1, 2.0
    z_update = mechanism.adjusted_noise_multiplier(z, sigma_b)
    pair = dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_update), dpa.GaussianDpEvent(2 * sigma_b)])
    rdp_pair = dpa.rdp.RdpAccountant().compose(pair).rdp
    rdp_one = dpa.rdp.RdpAccountant().compose(dpa.GaussianDpEvent(z)).rdp
    np.testing.assert_allclose(rdp_pair, rdp_one, rtol=1e-12)

