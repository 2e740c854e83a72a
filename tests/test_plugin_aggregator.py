"""An aggregator from outside fedmpi (issue 37): docs/how-to/own-algorithm.md's walk-through 3, examples/meamed.py,
run by `server.aggregator: examples.meamed:MeanAroundMedian` with no edit under fedmpi/. Its rule by hand on the
chunked sweep, its limit (f = 0 is the plain mean of equal-sized clients) on a whole in-process run, its figures,
and the contract a plug-in rule is held to (exit 2 naming the key)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, small_config, write_config

import fedmpi
from fedmpi import config
from fedmpi.cli import main
from fedmpi.core.errors import ConfigError
from fedmpi.robust.catalog import build_rule, rule_class
from fedmpi.robust.driver import aggregate_chunks
from fedmpi.robust.keys import RobustConfig

MEAMED = "examples.meamed:MeanAroundMedian"


@pytest.fixture
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def sweep_rule(rows, f, block=2):
    rows = np.asarray(rows, dtype=np.float32)
    n, d = rows.shape
    rule = build_rule(MEAMED, RobustConfig(f=f))
    return aggregate_chunks(rule, lambda lo, hi: rows[:, lo:hi].copy(), np.ones(n), d, block, block=block)


def test_the_rule_by_hand_on_chunks(importable):
    # coordinate 0: median 2, the 3 nearest of (1, 2, 3, 100) are 1, 2, 3 -> 2; coordinate 1: median 5.5,
    # nearest 3 of (5, 6, 7, -40) are 5, 6, 7 -> 6; coordinate 2: all 4 -> 1 (every value 1)
    out = sweep_rule([[1, 5, 1], [2, 6, 1], [3, 7, 1], [100, -40, 1]], f=1, block=1)
    assert out.update.tolist() == [2.0, 6.0, 1.0]
    # shares: client 3 gave one value of nine (coordinate 2, where the stable sort keeps it last of the ties)
    assert out.weights.sum() == pytest.approx(1.0) and out.weights[3] < out.weights[0]
    assert sweep_rule([[1, 5], [2, 6], [3, 7]], f=0).update.tolist() == [2.0, 6.0]   # f = 0: the mean


def test_at_f_0_a_whole_run_is_the_plain_mean(importable, tmp_path):
    """Equal client sizes (iid): FedAvg's weighted mean is the unweighted one; through the chunked gather
    the plug-in's mean must equal the reduction's to float rounding, every round."""
    base = small_config(tmp_path, rounds=3, partition={"clients": 10, "scheme": "iid"})
    plain = fedmpi.simulate(base)
    plug = fedmpi.simulate({**base, "server": {"clients_per_round": 5, "aggregator": MEAMED, "robust": {"f": 0}}})
    np.testing.assert_allclose(plug.model, plain.model, rtol=1e-5, atol=1e-6)
    robust = fedmpi.simulate({**base, "server": {"clients_per_round": 5, "aggregator": MEAMED}})
    assert not np.allclose(robust.model, plain.model, rtol=1e-5, atol=1e-6)     # f = 1 changes the model
    weights = robust.clients["robust_weight"]
    assert np.isfinite(weights).sum() == 3 * 5         # one share per counted client and round


def test_the_plug_in_is_held_to_its_declarations(importable, tmp_path, monkeypatch):
    assert rule_class(MEAMED).uses == ("f",) and rule_class(MEAMED)(RobustConfig()).passes() == 1
    # a server.robust key it does not read, set, is refused at set-up naming the key (exit 2, nothing written)
    cfg = small_config(tmp_path / "run", server={"clients_per_round": 5, "aggregator": MEAMED,
                                                 "robust": {"beta": 0.3}})
    assert main(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == 2
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=r"server.robust.beta"):
        fedmpi.simulate(cfg)
    # a class that is no Rule, or declares keys that do not exist
    (tmp_path / "badrules.py").write_text(
        "from fedmpi.robust.rules import Rule\n"
        "class NotARule:\n    name = 'x'\n"
        "class Typo(Rule):\n    name = 'typo'\n    uses = ('ff',)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"server.aggregator = 'badrules:NotARule'.*not a subclass"):
        rule_class("badrules:NotARule")
    with pytest.raises(ConfigError, match=r"Typo.uses must be a tuple of server.robust keys"):
        rule_class("badrules:Typo")
    # a name neither fedmpi's nor a plug-in's shape is refused when the config is read, suggesting one
    with pytest.raises(ConfigError, match=r"server.aggregator = 'medain': unknown \(did you mean 'median'\?\)"):
        config.from_dict({"server": {"aggregator": "medain"}})


def test_the_doc_shows_the_example_file_as_it_is():
    import re

    doc = (ROOT / "docs" / "how-to" / "own-algorithm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert (ROOT / "examples" / "meamed.py").read_text() in blocks
