"""Client-level DP (issue 16), split from tests/test_privacy.py by topic: the accounting (epsilon against Google's
dp-accounting and TF Privacy's published table) and the plan's cross-section checks (what is not client-level DP
as implemented). tests/test_privacy.py has the config section and the mechanism: clipping, the noise, DP-FedAvg's
average, Poisson sampling and adaptive clipping."""

import math
import sys

import numpy as np
import pytest
from test_privacy import NEEDS_DPA, POISSON, dpa

from fedmpi import config
from fedmpi.algorithms.fedavg import FedAvg, FedAvgKeys
from fedmpi.algorithms.fednova import FedNovaKeys
from fedmpi.algorithms.fedprox import FedProxKeys
from fedmpi.algorithms.safl import SaflKeys
from fedmpi.algorithms.scaffold import ScaffoldKeys
from fedmpi.core.errors import EXIT_USAGE, ConfigError
from fedmpi.privacy import accounting, plan
from fedmpi.privacy.accounting import Sampling
from fedmpi.privacy.keys import PrivacyConfig

# --- accounting ----------------------------------------------------------------------------------


@NEEDS_DPA
def test_epsilon_is_the_librarys_own_answer_for_poisson_sampling():
    for name, fresh in (("rdp", dpa.rdp.RdpAccountant), ("pld", dpa.pld.PLDAccountant)):
        direct = fresh().compose(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.3)), 40).get_epsilon(1e-5)
        assert accounting.epsilon(40, 1e-5, POISSON, 1.3, name) == direct


@NEEDS_DPA
def test_fixed_size_sampling_uses_replace_one_and_half_the_multiplier():
    fixed = Sampling("fixed", 100, 10)
    event = dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.3 / 2))
    rel = dpa.NeighboringRelation.REPLACE_ONE
    direct = dpa.rdp.RdpAccountant(neighboring_relation=rel).compose(event, 40).get_epsilon(1e-5)
    assert accounting.epsilon(40, 1e-5, fixed, 1.3) == direct
    # everyone every round: replacing a client moves the sum by 2C, a Gaussian of multiplier z / 2
    everyone = accounting.epsilon(5, 1e-5, Sampling("fixed", 10, 10), 3.0)
    plain = dpa.rdp.RdpAccountant().compose(dpa.GaussianDpEvent(1.5), 5).get_epsilon(1e-5)
    assert everyone == pytest.approx(plain, rel=1e-12)


@NEEDS_DPA
def test_pld_with_fixed_size_sampling_is_refused():
    with pytest.raises(ConfigError, match="privacy.accountant = 'pld' with server.sampling = 'fixed'"):
        accounting.epsilon(10, 1e-5, Sampling("fixed", 100, 10), 1.0, "pld")


@NEEDS_DPA
def test_no_noise_means_infinite_epsilon_and_no_rounds_none():
    assert accounting.epsilon(10, 1e-5, POISSON, 0.0) == math.inf
    assert accounting.epsilon(0, 1e-5, POISSON, 1.0) == 0.0
    assert np.isinf(accounting.epsilon_curve(3, 1e-5, POISSON, 0.0)).all()
    assert accounting.epsilon_curve(0, 1e-5, POISSON, 1.0).shape == (0,)


@NEEDS_DPA
def test_rdp_curve_is_exact_every_round():
    curve = accounting.epsilon_curve(60, 1e-5, POISSON, 1.0)
    assert curve.shape == (60,) and np.all(np.diff(curve) > 0)
    for t in (1, 2, 17, 60):
        assert curve[t - 1] == accounting.epsilon(t, 1e-5, POISSON, 1.0)


@NEEDS_DPA
def test_pld_curve_is_exact_on_its_grid_and_an_upper_bound_between():
    rounds = 20
    grid = accounting.pld_grid(rounds)
    assert list(grid) == list(range(1, 13)) + [14, 15, 16, 18, 20]
    curve = accounting.epsilon_curve(rounds, 1e-5, POISSON, 1.0, "pld")
    assert np.all(np.diff(curve) >= 0)
    for t in (1, 12, 14, 20):
        assert curve[t - 1] == pytest.approx(accounting.epsilon(t, 1e-5, POISSON, 1.0, "pld"), rel=1e-9)
    for t in (13, 17):      # off the grid: the next grid round's value, above the exact one
        assert curve[t - 1] == curve[t] > accounting.epsilon(t, 1e-5, POISSON, 1.0, "pld")


def test_grid_points_do_not_depend_on_the_run_length():
    assert set(accounting.pld_grid(30)) - {30} <= set(accounting.pld_grid(1000))


# TF Privacy's tutorials/README.md "Select Parameters" (MNIST DP-SGD: 60,000 examples, batch 256 -> q,
# delta = 1e-5, epsilon from the RDP accountant and printed to 2 decimals). TF Privacy converted RDP to
# (epsilon, delta) with eps = min_a rdp(a) + log(1/delta) / (a - 1) over its orders; dp-accounting 0.6.0
# uses a tighter conversion, so the library's epsilon must come out below the published one.
TF_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
TF_TABLE = [(1.12, 60, 2.92), (0.6, 30, 9.74), (1.2, 10, 1.20)]


@NEEDS_DPA
@pytest.mark.parametrize("z,epochs,published", TF_TABLE)
def test_tf_privacy_published_epsilons_are_reproduced(z, epochs, published):
    mnist = Sampling("poisson", 60000, 256)
    steps = math.ceil(epochs * 60000 / 256)
    acc = dpa.rdp.RdpAccountant(orders=TF_ORDERS).compose(accounting.round_event(mnist, z), steps)
    classic = float(np.min(acc.rdp + math.log(1 / 1e-5) / (np.array(TF_ORDERS) - 1)))
    assert classic == pytest.approx(published, abs=0.03)       # 2.922, 9.760, 1.198
    assert accounting.epsilon(steps, 1e-5, mnist, z) < classic


@NEEDS_DPA
def test_noise_for_epsilon_round_trips_with_rdp():
    z0, rounds = 1.3, 50
    eps = accounting.epsilon(rounds, 1e-5, POISSON, z0)
    z = accounting.noise_for_epsilon(eps, rounds, 1e-5, POISSON)
    assert z == pytest.approx(z0, abs=1e-3)
    assert accounting.epsilon(rounds, 1e-5, POISSON, z) <= eps
    fixed = Sampling("fixed", 100, 10)
    z = accounting.noise_for_epsilon(4.0, rounds, 1e-5, fixed)
    assert accounting.epsilon(rounds, 1e-5, fixed, z) <= 4.0 < accounting.epsilon(rounds, 1e-5, fixed, z - 1e-3)


@NEEDS_DPA
def test_noise_for_epsilon_with_pld_is_tight():
    z = accounting.noise_for_epsilon(3.0, 10, 1e-5, POISSON, "pld")
    def eps(noise):
        return accounting.epsilon(10, 1e-5, POISSON, noise, "pld")

    assert eps(z) <= 3.0 < eps(z - 1e-3)


def test_a_missing_library_is_a_usage_error_with_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    with pytest.raises(ConfigError, match=r"pip install 'fedmpi\[privacy\]'") as info:
        accounting.epsilon(10, 1e-5, POISSON, 1.0)
    assert info.value.exit_code == EXIT_USAGE


# --- plan and cross-section checks ---------------------------------------------------------------

DP = PrivacyConfig(mechanism="gaussian")
FEDAVG = FedAvgKeys()


def problems(privacy=DP, algorithm=FEDAVG, sampling=POISSON, client_steps=None):
    return plan.check(privacy, algorithm=algorithm, sampling=sampling, client_steps=client_steps)


def test_check_is_silent_for_a_sound_config_and_when_off():
    assert problems() == [] and problems(algorithm=FedProxKeys()) == []
    assert problems(PrivacyConfig(), algorithm=ScaffoldKeys(), sampling=Sampling("fixed", 100, 10)) == []


def test_check_names_what_is_not_dp_as_implemented():
    (msg,) = problems(algorithm=ScaffoldKeys())
    assert msg.startswith("algorithm.name = 'scaffold'") and "control-variate" in msg
    assert "probe-accuracy gap" in problems(algorithm=SaflKeys(gating=True))[0]
    assert problems(algorithm=SaflKeys()) == []
    assert "client.steps" in problems(algorithm=FedNovaKeys())[0]
    assert problems(algorithm=FedNovaKeys(), client_steps=5) == []


def test_check_catches_accountant_delta_and_count_noise():
    pld = PrivacyConfig(mechanism="gaussian", accountant="pld")
    assert "server.sampling = 'fixed'" in problems(pld, sampling=Sampling("fixed", 100, 10))[0]
    assert problems(PrivacyConfig(mechanism="gaussian", delta=0.02))[0].startswith("privacy.delta = 0.02")
    # expected cohort 10 -> sigma_b = 0.5 by default: z must stay below 2 sigma_b = 1
    assert "clip_count_stddev" in problems(PrivacyConfig(mechanism="gaussian", adaptive_clip=True))[0]
    fine = PrivacyConfig(mechanism="gaussian", adaptive_clip=True, noise_multiplier=0.8)
    assert problems(fine) == []


class _Declares(FedAvg):
    """An out-of-tree algorithm that declares its own privacy and sampling constraints."""

    name = "declares_limits"
    fixed_cohort_only = "its cohorts must hold exactly clients_per_round clients (a declaration)"

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        return [] if client_steps else ["its uploads reveal the step count (a declaration)"]


def test_an_algorithm_declares_its_own_privacy_and_sampling_constraints():
    from fedmpi.algorithms.base import Algorithm
    from fedmpi.privacy.plan import stage_problems
    from fedmpi.privacy.sampling import PoissonSampling

    keys = FedAvgKeys(name="mypkg.algo:Declares")
    (msg,) = plan.check(DP, algorithm=keys, sampling=POISSON, client_steps=None, algo_cls=_Declares)
    assert msg == ("algorithm.name = 'mypkg.algo:Declares' with privacy.mechanism = 'gaussian': not differentially "
                   "private as implemented: its uploads reveal the step count (a declaration) (docs/how-to/privacy.md, "
                   "Limits)")
    assert plan.check(DP, algorithm=keys, sampling=POISSON, client_steps=3, algo_cls=_Declares) == []
    cfg = config.from_dict({"algorithm": {"name": "fedavg"}, "privacy": {"mechanism": "gaussian"},
                            "partition": {"clients": 100}, "server": {"sampling": "poisson"}})
    assert stage_problems(cfg, _Declares) == [msg.replace("mypkg.algo:Declares", "fedavg")]
    with pytest.raises(ConfigError, match=r"server.sampling = 'poisson' with algorithm.name = 'fedavg': its cohorts "
                                          r"must hold exactly clients_per_round clients \(a declaration\); use "
                                          r"server.sampling: fixed"):
        PoissonSampling.check(cfg, _Declares)
    PoissonSampling.check(cfg, FedAvg)          # FedAvg declares nothing
    assert Algorithm.fixed_cohort_only == "" and Algorithm.privacy_problems(FedAvgKeys(), None) == []


@pytest.mark.parametrize("name,why", [
    ("central", "it trains one pseudo-client on as many samples as the fixed-size draw holds"),
    ("fedskip", "its model slots are laid out for exactly server.clients_per_round clients per round"),
])
def test_the_built_in_fixed_cohort_declarations_keep_their_messages(name, why):
    from fedmpi.algorithms import lookup
    from fedmpi.privacy.sampling import PoissonSampling

    cfg = config.from_dict({"algorithm": {"name": name}, "server": {"sampling": "poisson"}})
    with pytest.raises(ConfigError) as info:
        PoissonSampling.check(cfg, lookup(name))
    assert str(info.value) == (f"server.sampling = 'poisson' with algorithm.name = {name!r}: {why}; use "
                               f"server.sampling: fixed") and info.value.exit_code == EXIT_USAGE


@NEEDS_DPA
def test_resolve_adaptive_plan():
    privacy = PrivacyConfig(mechanism="gaussian", adaptive_clip=True, noise_multiplier=0.8, clip=0.3)
    p = plan.resolve(privacy, POISSON, rounds=20)
    assert p.count_stddev == 0.5 and p.noise_multiplier == 0.8
    assert p.update_noise_multiplier == pytest.approx((0.8 ** -2 - 1.0) ** -0.5)
    assert p.epsilon == accounting.epsilon(20, 1e-5, POISSON, 0.8)
    assert f"{p.epsilon:.4g}" in p.describe() and "q = 0.1" in p.describe()
    clip = plan.make_adaptive_clip(privacy, p)
    assert clip.clip == 0.3 and clip.expected_size == 10 and clip.count_stddev == 0.5
    assert plan.make_adaptive_clip(DP, plan.resolve(DP, POISSON, 20)) is None


@NEEDS_DPA
def test_resolve_calibrates_to_the_target_and_a_resume_keeps_the_recorded_noise():
    privacy = PrivacyConfig(mechanism="gaussian", target_epsilon=5.0)
    p = plan.resolve(privacy, POISSON, rounds=30)
    assert p.epsilon <= 5.0 and p.update_noise_multiplier == p.noise_multiplier != privacy.noise_multiplier
    resumed = plan.resolve(privacy, POISSON, rounds=60, noise_multiplier=p.noise_multiplier)
    assert resumed.noise_multiplier == p.noise_multiplier and resumed.epsilon > 5.0
    assert np.array_equal(p.epsilon_curve(), resumed.epsilon_curve()[:30])
