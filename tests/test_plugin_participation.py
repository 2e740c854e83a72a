"""A participation provider from outside fedmpi (issue 37): docs/how-to/own-algorithm.md's walk-through 7,
examples/cyclic_participation.py, run by `participation.name: examples.cyclic_participation:Cyclic` with no
edit under fedmpi/. Its plans by hand, a whole run that trains only the round's group, a resumable state, and
the contract a plug-in provider is held to (exit 2)."""

from __future__ import annotations

import re

import extension_runs as ext
import numpy as np
import pytest
from conftest import ROOT, small_config

import fedmpi
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError
from fedmpi.plans.catalog import provider_class

CYCLIC = "examples.cyclic_participation:Cyclic"


@pytest.fixture
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def _with(base, **keys):
    return {**base, "participation": {"name": CYCLIC, "keys": keys}}


class Everyone:
    sizes = None

    def select(self, t, standard, sizes):
        return standard


def test_the_plans_by_hand(importable):
    cls = provider_class(CYCLIC, ("seed", "partition", "server", "participation"))
    provider = cls(Everyone(), seed=4, num_clients=10, clients_per_round=3, groups=2)
    for t in range(4):
        group = np.arange(t % 2, 10, 2)
        expected = np.sort(rng.stream(4, rng.SELECT, t, 7).choice(group, size=3, replace=False))
        plan = provider.plan(t)
        assert np.array_equal(plan.selected, expected) and np.all(plan.selected % 2 == t % 2)
    other = cls(Everyone(), seed=4, num_clients=10, clients_per_round=3, groups=2)      # another rank
    assert all(np.array_equal(other.plan(t).selected, provider.plan(t).selected) for t in range(4))


def test_a_whole_run_trains_only_the_round_s_group(importable, tmp_path):
    base = small_config(tmp_path, rounds=4)
    run = fedmpi.simulate(_with(base, groups=3))
    selected = run.clients["selected"] == 1
    for t in range(4):
        cids = np.flatnonzero(selected[t])
        assert len(cids) == 4 and np.all(cids % 3 == t % 3)     # 12 clients: groups of 4, 5 asked for
    assert not np.array_equal(run.model, fedmpi.simulate(base).model)


def test_the_plug_in_is_held_to_its_declarations(importable, tmp_path, monkeypatch):
    base = small_config(tmp_path, rounds=1)
    with pytest.raises(ConfigError, match=r"participation.keys.size = 2: is not read by"):
        fedmpi.simulate(_with(base, size=2))
    with pytest.raises(ConfigError, match=r"server.sampling = 'poisson' asks for another provider"):
        fedmpi.simulate({**_with(base), "server": {"clients_per_round": 5, "sampling": "poisson"}})
    with pytest.raises(ConfigError, match=r"does not declare works_with_dp"):
        fedmpi.simulate({**_with(base), "privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0}})
    with pytest.raises(ConfigError, match=r"the deployment's keys"):
        fedmpi.simulate({**_with(base), "clients": {"dropout": 0.2}})
    with pytest.raises(ConfigError, match=r"plans for the reduce, gather protocol\(s\)"):
        fedmpi.simulate({**_with(base), "algorithm": {"name": "fedskip"}})
    (tmp_path / "badplans.py").write_text(
        "from fedmpi.plans.base import Participation\n"
        "class NoBuild(Participation):\n    def standard(self, t):\n        return []\n"
        "class NoPlan(Participation):\n    @classmethod\n    def build(cls, setting):\n        return None\n"
        "class NotOne:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, message in [("NoBuild", "does not define build"), ("NoPlan", r"defines neither plan\(t\)"),
                          ("NotOne", "not a subclass of fedmpi.plans.base.Participation")]:
        with pytest.raises(ConfigError, match=message):
            provider_class(f"badplans:{name}", ("seed", "partition", "server"))


def test_the_doc_shows_the_example_file_as_it_is():
    doc = (ROOT / "docs" / "how-to" / "own-algorithm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert (ROOT / "examples" / "cyclic_participation.py").read_text() in blocks


@pytest.mark.mpi
def test_mpiexec_n3_gives_the_in_process_model_and_resumes_bit_identically(importable, request, tmp_path_factory):
    ext.assert_n3_is_in_process_and_resumes("cyclic", request, tmp_path_factory)
