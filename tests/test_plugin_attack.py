"""A model attack from outside fedmpi (issue 37): docs/how-to/own-algorithm.md's walk-through 4,
examples/norm_matched_noise.py, run by `attack.name: examples.norm_matched_noise:NormMatchedNoise` with no edit
under fedmpi/. Its upload by hand from the client's stream, a whole in-process run whose per-client figures
show the norm kept and the direction replaced, and the contract a plug-in attack is held to (exit 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ROOT, small_config

import fedmpi
from fedmpi import config
from fedmpi.attacks.catalog import PLUGIN_DRAW, AttackContext, attack_class
from fedmpi.attacks.keys import AttackConfig
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError

NOISE = "examples.norm_matched_noise:NormMatchedNoise"


@pytest.fixture
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def test_the_upload_by_hand(importable):
    keys = AttackConfig(name=NOISE, scale=2.0)
    update = torch.tensor([3.0, 4.0, 0.0])
    ctx = AttackContext(5, 7, keys, rng.stream(1, rng.ATTACK, 5, 7, PLUGIN_DRAW))
    out = attack_class(NOISE)(keys).poison(update, ctx)
    g = rng.stream(1, rng.ATTACK, 5, 7, PLUGIN_DRAW).standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(out.numpy(), g * (2.0 * 5.0 / np.linalg.norm(g)), rtol=1e-6)
    assert float(out.norm()) == pytest.approx(10.0, rel=1e-6)


def test_a_whole_run_keeps_the_norms_and_replaces_the_directions(importable, tmp_path):
    """Round 0: every client trains from the same x_0, so a malicious client's honest update is the one
    it has in the attack-free run; the attack keeps its norm (update_norm equal to float rounding) and
    replaces its direction (update_cosine to the round's mean differs), for exactly the malicious clients."""
    base = small_config(tmp_path, rounds=1, partition={"clients": 8, "scheme": "iid"},
                        server={"clients_per_round": 8}, eval={"client_drift": True})
    honest = fedmpi.simulate(base)
    attacked = fedmpi.simulate({**base, "attack": {"name": NOISE, "clients": [2, 5]}})
    h, a = honest.clients, attacked.clients
    np.testing.assert_allclose(a["update_norm"], h["update_norm"], rtol=1e-5)
    moved = ~np.isclose(a["update_cosine"], h["update_cosine"], rtol=1e-3, atol=1e-4)
    assert moved[0][[2, 5]].all()
    assert not np.allclose(attacked.model, honest.model)
    assert attacked.experiment.malicious.tolist() == [2, 5]


def test_the_plug_in_is_held_to_its_declarations(importable, tmp_path, monkeypatch):
    base = small_config(tmp_path, rounds=1)
    with pytest.raises(ConfigError, match=r"attack.sigma = 3.0: is not used by attack.name"):
        fedmpi.simulate({**base, "attack": {"name": NOISE, "sigma": 3.0}})
    (tmp_path / "badattacks.py").write_text(
        "from fedmpi.attacks.catalog import ModelAttack\n"
        "class NoPoison(ModelAttack):\n    name = 'x'\n"
        "class NotOne:\n    name = 'y'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"NoPoison does not define poison"):
        attack_class("badattacks:NoPoison")
    with pytest.raises(ConfigError, match=r"not a subclass of fedmpi.attacks.catalog.ModelAttack"):
        attack_class("badattacks:NotOne")
    with pytest.raises(ConfigError, match=r"attack.name = 'flip'.*plug-in model attack"):
        config.from_dict({"attack": {"name": "flip"}})


def test_the_doc_shows_the_example_file_as_it_is():
    import re

    doc = (ROOT / "docs" / "how-to" / "own-algorithm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert (ROOT / "examples" / "norm_matched_noise.py").read_text() in blocks
