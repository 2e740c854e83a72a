"""Secure aggregation made comparable (issue 40): weighted secure aggregation (`secagg.weighting: samples`: w_i =
n_i / n_max multiplied in before masking) is FedAvg's sample-weighted average at its limit, as the uniform one is
FedAvg with uniform weights; the protocol's download bytes count in /metrics/bytes_down; the clip warning."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_config

import fedmpi
from fedmpi import config
from fedmpi.core.errors import ConfigError

LIMIT = {"bits": 64, "clip": 1.0e5, "scale": 2.0 ** 40}     # no update reaches the clip; rounding ~2^-40


def _base(tmp_path, **sections):
    # Dirichlet sizes: the clients' sample counts differ, so sample weights are not uniform ones.
    return small_config(tmp_path, rounds=2, partition={"clients": 10, "scheme": "dirichlet", "beta": 0.5},
                        server={"clients_per_round": 5}, **sections)


def _secure(base, **secagg):
    return {**base, "server": {"clients_per_round": 5, "secure_aggregation": "secagg"}, "secagg": {**LIMIT, **secagg}}


def test_weighted_secure_aggregation_is_fedavg_at_its_limit(tmp_path):
    base = _base(tmp_path)
    parts = fedmpi.simulate(base, rounds=1).experiment.split.parts
    assert len({len(p) for p in parts}) > 1                          # unequal clients: the weights matter
    weighted = fedmpi.simulate(base)                                 # FedAvg: sample-count weights
    uniform = fedmpi.simulate({**base, "server": {"clients_per_round": 5, "weighting": "uniform"}})
    masked_weighted = fedmpi.simulate(_secure(base, weighting="samples"))
    masked_uniform = fedmpi.simulate(_secure(base))
    assert np.abs(masked_weighted.model - weighted.model).max() <= 1e-7
    assert np.abs(masked_uniform.model - uniform.model).max() <= 1e-7
    assert np.abs(weighted.model - uniform.model).max() > 1e-4       # (so the two limits are told apart)


def test_secure_aggregations_key_and_share_messages_count_in_bytes_down(tmp_path):
    base = _base(tmp_path)
    clear, masked = fedmpi.simulate(base), fedmpi.simulate(_secure(base))
    cohort = masked.metrics["secagg_survivors"] + masked.metrics["secagg_dropped"]
    received = masked.metrics["secagg_extra_down_bytes"] * cohort
    assert (received > 0).all()
    np.testing.assert_allclose(masked.metrics["bytes_down"], clear.metrics["bytes_down"] + received)


def test_the_clip_warning_says_so_once_and_names_every_round(tmp_path, capfd):
    masked = fedmpi.simulate(_secure(_base(tmp_path), clip=1e-6, bits=32, scale=65536.0))
    err = capfd.readouterr().err
    assert err.count("fedmpi: warning: round 1: 100% of the updates were clipped to secagg.clip = 1e-06") == 1
    assert "privacy: {mechanism: gaussian, clip: 1e-06, noise_multiplier: 0}" in err
    assert (masked.metrics["secagg_clipped_fraction"] == 1.0).all()


@pytest.mark.parametrize("value", ["sample", 1, None])
def test_secagg_weighting_is_uniform_or_samples(tmp_path, value):
    with pytest.raises(ConfigError, match="secagg.weighting"):
        config.from_dict(_secure(_base(tmp_path), weighting=value))
