"""Configuration: types, ranges, unknown keys, overrides, and the exit-2 contract of the CLI."""

import hashlib

import pytest

from fedmpi import config
from fedmpi.cli import main
from fedmpi.core.errors import ConfigError


def errors_of(mapping):
    with pytest.raises(ConfigError) as info:
        config.from_dict(mapping)
    return info.value.messages


def test_defaults_validate_and_round_trip_through_yaml():
    cfg = config.from_dict({})
    assert cfg.algorithm.name == "fedavg"
    again = config.from_yaml(cfg.to_yaml())
    assert again == cfg and again.hash() == cfg.hash()


def test_unknown_key_suggests_the_closest_name():
    (msg,) = errors_of({"partiton": {"clients": 3}})
    assert "unknown key 'partiton'" in msg and "did you mean 'partition'" in msg
    (msg,) = errors_of({"client": {"epochz": 2}})
    assert "client.epochz" in msg and "'epochs'" in msg


def test_wrong_type_names_key_value_and_expected_type():
    (msg,) = errors_of({"rounds": "ten"})
    assert msg == "rounds = 'ten': must be an integer"
    (msg,) = errors_of({"client": {"lr": True}})
    assert "client.lr = True" in msg and "a number" in msg


def test_out_of_range_values_and_cross_section_rule():
    (msg,) = errors_of({"rounds": -1})
    assert msg.startswith("rounds = -1") and "[0, " in msg
    (msg,) = errors_of({"partition": {"clients": 5}, "server": {"clients_per_round": 6}})
    assert "server.clients_per_round = 6" in msg and "partition.clients (5)" in msg


def test_unknown_algorithm_and_dataset_list_the_allowed_names():
    (msg,) = errors_of({"algorithm": {"name": "fedag"}})
    assert "algorithm.name = 'fedag'" in msg and "did you mean 'fedavg'" in msg and "scaffold" in msg
    (msg,) = errors_of({"data": {"name": "mnst"}})
    assert "data.name = 'mnst'" in msg and "mnist5k" in msg


def test_every_error_of_a_config_is_reported_at_once():
    msgs = errors_of({"rounds": -2, "seed": "x", "model": {"nme": "lr"}, "fsl": 1})
    assert len(msgs) == 4


def test_algorithm_keys_belong_to_the_named_algorithm():
    cfg = config.from_dict({"algorithm": {"name": "fsl", "gamma": 0.5}})
    assert cfg.algorithm.gamma == 0.5 and cfg.algorithm.mode == "incremental"
    (msg,) = errors_of({"algorithm": {"name": "fedavg", "gamma": 0.5}})
    assert "algorithm.gamma" in msg


def test_dotted_overrides_parse_values_as_yaml():
    base = {"rounds": 5, "algorithm": {"name": "fedavg"}}
    merged = config.apply_overrides(base, ["rounds=50", "algorithm.name=fsl", "algorithm.gamma=2",
                                           "client.steps=null", "data.iid=true"])
    cfg = config.from_dict(merged)
    assert (cfg.rounds, cfg.algorithm.name, cfg.algorithm.gamma) == (50, "fsl", 2.0)
    assert cfg.client.steps is None and cfg.data.iid is True and base["rounds"] == 5
    with pytest.raises(ConfigError, match="expected key=value"):
        config.apply_overrides(base, ["rounds"])


def test_hash_ignores_runtime_keys_only():
    a = config.from_dict({"rounds": 5})
    assert a.hash() == config.from_dict({"rounds": 9, "runtime": {"threads": 2}}).hash()
    assert a.hash() != config.from_dict({"seed": 3}).hash()
    assert config.differing_keys(a, config.from_dict({"seed": 3, "rounds": 7})) == ["seed"]


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("bad", [
    "rounds: -3\n",
    "rounds: 2\npartiton: {clients: 3}\n",
    "rounds: ten\n",
    "partition: {clients: 4}\nserver: {clients_per_round: 5}\n",
    "algorithm: {name: nope}\n",
    "data: {name: imagenet}\n",
    "rounds: [1\n",
])
def test_bad_config_exits_2_and_leaves_existing_output_untouched(tmp_path, capsys, bad):
    out = tmp_path / "run"
    out.mkdir()
    existing = out / "run.h5"
    existing.write_bytes(b"an earlier run's file")
    before = _digest(existing)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"out: {out}\n" + bad)
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "fedmpi: config error:" in err
    assert _digest(existing) == before and sorted(p.name for p in out.iterdir()) == ["run.h5"]


def test_existing_run_is_not_overwritten_without_flag(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.h5").write_bytes(b"keep me")
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(f"out: {out}\n")
    assert main(["run", str(cfg)]) == 2
    assert "--resume" in capsys.readouterr().err and (out / "run.h5").read_bytes() == b"keep me"


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
