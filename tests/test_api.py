"""`fedmpi.simulate`'s config handling: dotted overrides given in Python keep their values (no YAML parse
of their text), whether the config is a YAML path, a mapping or a Config."""

from __future__ import annotations

import pytest
from conftest import small_config, write_config

from fedmpi import config
from fedmpi.core.errors import ConfigError
from fedmpi.run.api import as_config

# adam: the optimizer that reads tau and betas (keys another optimizer does not read are refused)
OVERRIDES = {"runtime.progress": "off", "server.optimizer": "adam", "server.tau": 1e-5, "server.betas": [0.5, 0.75],
             "algorithm.name": "fedprox", "algorithm.mu": 0.5}


def check(cfg):
    # 'off' would be false and 1e-05 a string had the values gone through a YAML parse of their text
    assert cfg.runtime.progress == "off" and cfg.server.tau == 1e-5 and cfg.server.betas == (0.5, 0.75)
    assert cfg.algorithm.name == "fedprox" and cfg.algorithm.mu == 0.5


def test_overrides_keep_their_values_for_a_path_a_mapping_and_a_config(tmp_path):
    mapping = small_config(tmp_path / "out")
    path = write_config(tmp_path / "c.yaml", mapping)
    for source in (path, str(path), mapping, config.from_dict(mapping)):
        check(as_config(source, OVERRIDES))
    assert as_config(path).runtime.progress == "lines"          # the file's own value without overrides


def test_a_bad_override_is_named(tmp_path):
    path = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out"))
    with pytest.raises(ConfigError, match="client.lr = -1"):
        as_config(path, {"client.lr": -1})
    with pytest.raises(ConfigError, match="not found"):
        as_config(tmp_path / "missing.yaml")
