"""Issue 29, finding 7: keys that have no effect in the chosen form (a schedule's, a server optimizer's, every
section's form keys) are refused when set to a non-default value, as the deployment keys of another form are,
and accepted at their defaults or where the form reads them. Split from tests/test_hardening_inputs.py by
topic (finding 6, what raised a traceback, there). All in one process, refused while the config is read."""

from __future__ import annotations

import pytest
from conftest import small_config, write_config
from test_hardening_inputs import cli, problems

from fedmpi import config
from fedmpi.core.errors import EXIT_USAGE

# -- finding 7: keys that have no effect in the chosen form are refused -------------------------------------

@pytest.mark.parametrize("schedule, key, value", [
    ("constant", "gamma", 0.5), ("constant", "step_rounds", 5), ("constant", "rounds", 10),
    ("constant", "min_lr", 0.01), ("exponential", "step_rounds", 5), ("exponential", "min_lr", 0.01),
    ("step", "rounds", 10), ("cosine", "gamma", 0.5), ("cosine", "step_rounds", 5),
])
def test_schedule_keys_another_schedule_reads_are_refused(schedule, key, value):
    for section in ("client", "server"):
        messages = problems({section: {"lr_schedule": {"name": schedule, key: value}}})
        assert messages == [f"{section}.lr_schedule.{key} = {value}: is not used by the {schedule!r} schedule "
                            f"(only by {messages[0].split('(only by ')[1]}"], messages


def test_schedule_keys_at_their_defaults_or_used_are_accepted():
    for schedule in ({"name": "constant", "gamma": 1.0, "step_rounds": 1, "rounds": None, "min_lr": 0.0},
                     {"name": "exponential", "gamma": 0.99, "warmup_rounds": 3},
                     {"name": "step", "gamma": 0.5, "step_rounds": 10},
                     {"name": "cosine", "rounds": 50, "min_lr": 0.001, "warmup_rounds": 2}):
        assert config.from_dict({"client": {"lr_schedule": schedule}, "server": {"lr_schedule": schedule}})


def test_cosine_min_lr_above_lr_is_refused():
    messages = problems({"client": {"lr": 0.1, "lr_schedule": {"name": "cosine", "min_lr": 0.5}}})
    assert messages == ["client.lr_schedule.min_lr = 0.5: must be <= client.lr (0.1): the cosine schedule decays "
                        "from lr down to min_lr"]
    messages = problems({"server": {"lr": 1.0, "lr_schedule": {"name": "cosine", "min_lr": 2.0}}})
    assert messages[0].startswith("server.lr_schedule.min_lr = 2.0: must be <= server.lr (1)")
    assert config.from_dict({"client": {"lr": 0.1, "lr_schedule": {"name": "cosine", "min_lr": 0.1}}})


@pytest.mark.parametrize("optimizer, keys, refused_keys", [
    ("sgd", {"momentum": 0.5}, ["server.momentum"]),
    ("sgd", {"betas": [0.8, 0.99], "tau": 0.01}, ["server.betas", "server.tau"]),
    ("avgm", {"tau": 0.01}, ["server.tau"]),
    ("adam", {"momentum": 0.0}, ["server.momentum"]),
    ("adagrad", {"betas": [0.9, 0.5]}, ["server.betas"]),
])
def test_server_optimizer_keys_the_rule_does_not_read_are_refused(optimizer, keys, refused_keys):
    messages = problems({"server": {"optimizer": optimizer, **keys}})
    assert [m.split(" = ")[0] for m in messages] == refused_keys, messages
    assert all(f"is not used by server.optimizer {optimizer!r}" in m for m in messages), messages


def test_server_optimizer_keys_used_or_at_default_are_accepted():
    for server in ({"optimizer": "sgd", "momentum": 0.9, "betas": [0.9, 0.99], "tau": 1e-3},
                   {"optimizer": "avgm", "momentum": 0.5},
                   {"optimizer": "adam", "betas": [0.8, 0.9], "tau": 0.01},
                   {"optimizer": "yogi", "betas": [0.8, 0.9], "tau": 0.01},
                   {"optimizer": "adagrad", "betas": [0.5, 0.99], "tau": 0.01}):
        assert config.from_dict({"server": server})


# One case per section: (the section's mapping, the key refused, the message's form and the forms reading it).
NO_EFFECT = [
    ({"partition": {"scheme": "iid", "beta": 0.1}}, "partition.beta = 0.1",
     "partition.scheme 'iid' (only by dirichlet, quantity)"),
    ({"partition": {"scheme": "dirichlet", "shards_per_client": 5}}, "partition.shards_per_client = 5",
     "partition.scheme 'dirichlet' (only by shards)"),
    ({"partition": {"scheme": "labels", "groups": [{"clients": 30, "labels": [1]}]}},
     "partition.groups = ((30, (...)),)", "partition.scheme 'labels' (only by groups)"),
    ({"server_data": {"size": 10, "scheme": "iid", "classes": 3}}, "server_data.classes = 3",
     "server_data.scheme 'iid' (only by classes)"),
    ({"server_data": {"size": 10, "scheme": "classes", "beta": 2.0}}, "server_data.beta = 2.0",
     "server_data.scheme 'classes' (only by dirichlet)"),
    ({"data": {"name": "mnist5k", "alpha": 0.5}}, "data.alpha = 0.5", "data.name 'mnist5k' (only by synthetic)"),
    ({"data": {"name": "mnist", "split": "digits"}}, "data.split = 'digits'", "data.name 'mnist' (only by emnist)"),
    ({"data": {"name": "synthetic", "download": True}}, "data.download = True", "data.name 'synthetic' (only by"),
    ({"client": {"compress": {"name": "sign", "fraction": 0.1}}}, "client.compress.fraction = 0.1",
     "client.compress.name 'sign' (only by topk, randk)"),
    ({"client": {"compress": {"name": "topk", "levels": 4}}}, "client.compress.levels = 4",
     "client.compress.name 'topk' (only by qsgd)"),
    ({"clients": {"speed": {"kind": "fixed", "sigma": 1.0}}}, "clients.speed.sigma = 1.0",
     "clients.speed.kind 'fixed' (only by lognormal)"),
    ({"clients": {"bandwidth": {"kind": "trace", "trace": "bw.csv", "up": 5.0}}}, "clients.bandwidth.up = 5.0",
     "clients.bandwidth.kind 'trace' (only by fixed, lognormal)"),
]


@pytest.mark.parametrize("mapping, refused_key, form", NO_EFFECT, ids=[case[1].split(" =")[0] for case in NO_EFFECT])
def test_keys_the_chosen_form_does_not_read_are_refused(mapping, refused_key, form):
    messages = problems(mapping)
    assert len(messages) == 1 and messages[0].startswith(f"{refused_key}: is not used by {form}"), messages
    assert messages[0].endswith("that uses it"), messages


FORM_KEYS = ("scheme", "name", "kind", "size", "trace")     # what the cases choose; the rest is set back


def _at_default(mapping, default):
    """`mapping` (a copy) with every key but the form's set to its value in `default` (Config().to_dict())."""
    return {key: _at_default(value, default[key]) if isinstance(value, dict)
            else value if key in FORM_KEYS else default[key] for key, value in mapping.items()}


@pytest.mark.parametrize("mapping", [case[0] for case in NO_EFFECT], ids=[case[1].split(" =")[0] for case in NO_EFFECT])
def test_the_same_keys_at_their_defaults_are_accepted(mapping):
    at_default = _at_default(mapping, config.Config().to_dict())
    assert at_default != mapping and config.from_dict(at_default)


def test_keys_the_chosen_form_reads_are_accepted():
    assert config.from_dict({"partition": {"scheme": "quantity", "beta": 0.1, "min_samples": 3},
                             "server_data": {"size": 10, "scheme": "classes", "classes": 3},
                             "data": {"name": "emnist", "split": "digits", "download": True},
                             "client": {"compress": {"name": "qsgd", "levels": 4}},
                             "clients": {"speed": {"kind": "lognormal", "value": 3.0, "sigma": 1.0}}})


def test_privacy_keys_stay_accepted_without_their_mechanism():
    # Deliberately not refused: with mechanism none the section is inert (left out of the hash), so that one
    # config serves both the DP runs and the no-DP baseline (`privacy.mechanism=none`), as docs/how-to/privacy.md says.
    assert config.from_dict({"privacy": {"mechanism": "none", "clip": 0.5, "adaptive_clip": True}})


def test_a_no_effect_key_in_a_config_file_exits_2(capsys, tmp_path):
    path = write_config(tmp_path / "c.yaml", small_config(tmp_path / "run", server={"clients_per_round": 5,
                                                                                     "momentum": 0.5}))
    code, err = cli(capsys, "run", path)
    assert code == EXIT_USAGE and "server.momentum = 0.5: is not used by server.optimizer 'sgd'" in err, err
    assert not (tmp_path / "run").exists()


def test_the_config_hash_of_a_config_with_defaults_is_unchanged():
    # Refusing keys changes no accepted config: the default config's hash is the one recorded before.
    assert config.Config().hash() == config.from_dict({"server": {"momentum": 0.9, "tau": 1e-3}}).hash()
