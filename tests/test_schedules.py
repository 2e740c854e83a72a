"""Learning-rate schedules (`client.lr_schedule`, `server.lr_schedule`, fedmpi/core/schedules.py): each schedule
and the warm-up against hand values; the rates logged as /metrics/client_lr and /metrics/server_lr; a
decaying client rate changes training exactly as the numpy reference says (SCAFFOLD's control update uses
the round's rate); and --resume refuses a changed `rounds` when a cosine schedule takes its horizon from it.
"""

from __future__ import annotations

import math

import extension_runs as ext
import numpy as np
import pytest
import regression_problem as rp
from conftest import read_metrics

from fedmpi import config
from fedmpi.core.errors import ConfigError
from fedmpi.core.schedules import LearningRate, ScheduleConfig, lr_at
from fedmpi.io import checkpoint, resume


def rates(base, n, run_rounds=10, **sched):
    """The rates of rounds 0..n-1 from `base` under the schedule `sched`, in a run of `run_rounds` rounds."""
    return [lr_at(base, ScheduleConfig(**sched), t, run_rounds) for t in range(n)]


# --- hand values ------------------------------------------------------------------------------------------------

def test_constant():
    assert rates(0.1, 4) == [0.1] * 4


def test_exponential_multiplies_by_gamma_every_round():
    np.testing.assert_allclose(rates(0.1, 4, name="exponential", gamma=0.5), [0.1, 0.05, 0.025, 0.0125], rtol=1e-15)


def test_step_multiplies_by_gamma_every_step_rounds():
    got = rates(0.1, 7, name="step", gamma=0.5, step_rounds=3)
    np.testing.assert_allclose(got, [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025], rtol=1e-15)


def test_cosine_with_an_explicit_horizon_and_floor():
    # min + (base - min) (1 + cos(pi t / 4)) / 2 with base 0.1, min 0.02: t = 1 gives 0.02 + 0.04 (1 + sqrt(1/2));
    # from t = 4 on it stays at the floor.
    got = rates(0.1, 6, name="cosine", rounds=4, min_lr=0.02)
    want = [0.1, 0.02 + 0.04 * (1 + math.sqrt(0.5)), 0.06, 0.02 + 0.04 * (1 - math.sqrt(0.5)), 0.02, 0.02]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_cosine_without_a_horizon_uses_the_runs_rounds():
    # T = run_rounds = 2: 0.1, then (1 + cos(pi/2)) / 2 = 0.5 of it.
    np.testing.assert_allclose(rates(0.1, 2, run_rounds=2, name="cosine"), [0.1, 0.05], rtol=1e-12)
    assert ScheduleConfig(name="cosine").depends_on_run_length
    assert not ScheduleConfig(name="cosine", rounds=2).depends_on_run_length
    assert not ScheduleConfig(name="exponential").depends_on_run_length


def test_linear_warmup_over_the_first_rounds():
    # factor (t + 1) / 4 for t < 4, then the schedule alone
    np.testing.assert_allclose(rates(0.2, 6, warmup_rounds=4), [0.05, 0.1, 0.15, 0.2, 0.2, 0.2], rtol=1e-15)
    # with exponential decay: 0.2 * 0.5^t * (t + 1) / 2 for t < 2
    np.testing.assert_allclose(rates(0.2, 4, name="exponential", gamma=0.5, warmup_rounds=2),
                               [0.1, 0.1, 0.05, 0.025], rtol=1e-15)


def test_client_and_server_rates_follow_their_own_keys():
    cfg = config.from_dict({"client": {"lr": 0.1, "lr_schedule": {"name": "exponential", "gamma": 0.5}},
                            "server": {"lr": 2.0, "lr_schedule": "cosine"}, "rounds": 2})
    client, server = LearningRate.of(cfg.client, cfg.rounds), LearningRate.of(cfg.server, cfg.rounds)
    assert [client.at(t) for t in range(2)] == [0.1, 0.05]
    np.testing.assert_allclose([server.at(t) for t in range(2)], [2.0, 1.0], rtol=1e-12)


@pytest.mark.parametrize("section,keys,named", [
    ("client", {"name": "linear"}, "client.lr_schedule.name"),
    ("client", {"name": "exponential", "gamma": 1.5}, "client.lr_schedule.gamma"),
    ("server", {"name": "step", "step_rounds": 0}, "server.lr_schedule.step_rounds"),
    ("server", {"name": "cosine", "min_lr": -1.0}, "server.lr_schedule.min_lr"),
    ("client", {"warmup_rounds": -2}, "client.lr_schedule.warmup_rounds"),
    ("client", {"nmae": "step"}, "client.lr_schedule.nmae"),
])
def test_bad_schedule_keys_are_named(section, keys, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        config.from_dict({section: {"lr_schedule": keys}})


# --- logged and used in training ---------------------------------------------------------------------------------

def test_rates_are_logged_every_round():
    cfg = rp.config("fedavg", rounds=4, lr=0.1, client={"lr_schedule": {"name": "exponential", "gamma": 0.5}},
                    server={"lr": 0.8, "lr_schedule": {"name": "step", "gamma": 0.5, "step_rounds": 2,
                                                       "warmup_rounds": 2}})
    result = rp.simulate(cfg)
    np.testing.assert_allclose(result.metrics["client_lr"], [0.1, 0.05, 0.025, 0.0125], rtol=1e-7)
    # 0.8 * 0.5^(t // 2), times (t + 1) / 2 in the first two rounds
    np.testing.assert_allclose(result.metrics["server_lr"], [0.4, 0.8, 0.4, 0.4], rtol=1e-7)


def test_exponential_decay_changes_scaffold_training_as_the_reference_says():
    decayed = rp.config("scaffold", lr=0.1, client={"lr_schedule": {"name": "exponential", "gamma": 0.5}})
    lr_of = lambda t: 0.1 * 0.5 ** t  # noqa: E731
    want, c, c_i = rp.scaffold_reference(lr_of=lr_of)
    for model, ref in zip(rp.models_per_round(decayed, 3), want):
        rp.assert_model(model, ref)
    result = rp.simulate(decayed)
    np.testing.assert_allclose(result.experiment.algo.server_state()["c"], c, rtol=1e-5, atol=1e-6)
    for cid in range(rp.N_CLIENTS):
        np.testing.assert_allclose(result.experiment.client_state(cid)["c_i"], c_i[cid], rtol=1e-5, atol=1e-6)
    # The control update divides by K times the round's rate: with the base rate there instead, c differs, and
    # the decay changes the model at all.
    _, c_base, _ = rp.scaffold_reference(lr_of=lr_of, control_lr_of=lambda t: 0.1)
    assert not np.allclose(c_base, c, rtol=1e-3)
    assert not np.allclose(result.model, rp.simulate(rp.config("scaffold", lr=0.1)).model, rtol=1e-3)


@pytest.fixture(scope="module")
def runs(request):
    return ext.shared(request)


@pytest.mark.mpi
def test_rates_in_the_run_file(runs):
    """The shared -n 3 launch's external run: client exponential 0.8 from 0.05; server step 0.5 every 2 rounds
    with 2 warm-up rounds from 1.0; unchanged by its --resume."""
    for name in ("external", "external-resumed"):
        metrics, _ = read_metrics(runs[name])
        np.testing.assert_allclose(metrics["client_lr"], [0.05 * 0.8 ** t for t in range(ext.R)], rtol=1e-7)
        np.testing.assert_allclose(metrics["server_lr"], [0.5, 1.0, 0.5, 0.5, 0.25, 0.25], rtol=1e-7)


# --- resume and the cosine horizon --------------------------------------------------------------------------------

def checkpoint_after(tmp_path, rounds, **sections):
    """A real checkpoint file after `rounds` rounds of a regression run whose config has `rounds` rounds."""
    cfg = config.from_dict({**rp.config("fedavg", rounds=rounds, **sections), "out": str(tmp_path)})
    result = rp.simulate(cfg)
    return cfg, checkpoint.save(result.experiment, rounds, wall_s=0.0)


@pytest.mark.parametrize("section", ["client", "server"])
def test_resume_refuses_new_rounds_when_cosine_takes_its_horizon_from_them(tmp_path, section):
    cfg, path = checkpoint_after(tmp_path, 2, **{section: {"lr_schedule": "cosine"}})
    longer = config.from_dict({**cfg.to_dict(), "rounds": 4})
    with pytest.raises(ConfigError, match=rf"rounds = 4: .*{section}\.lr_schedule .*keep rounds = 2"):
        resume.choose(longer, say=lambda text: None)
    resume._check_config(path, checkpoint.verify(path), cfg)        # the same rounds: accepted


@pytest.mark.parametrize("sched", [{"name": "cosine", "rounds": 10}, {"name": "exponential", "gamma": 0.9}])
def test_resume_accepts_new_rounds_when_the_rates_do_not_depend_on_them(tmp_path, sched):
    cfg, path = checkpoint_after(tmp_path, 2, client={"lr_schedule": sched})
    longer = config.from_dict({**cfg.to_dict(), "rounds": 4})
    resume._check_config(path, checkpoint.verify(path), longer)
