"""local, fedper, lgfedavg, fedbn (issue 24): which entries each keeps personal, one round of each rule and
its reduction on hand-computed vectors, the refusals of models that lack the layers they need, and (issue 38)
the refusal, for every registered algorithm with its own split, of a split that keeps nothing personal (a run
that would be FedAvg recorded under the algorithm's name)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import server_update
from torch import nn

from fedmpi import config
from fedmpi.algorithms import algorithm_context, declares_personal_split, personal_split
from fedmpi.algorithms.base import ClientRun
from fedmpi.algorithms.registry import REGISTRY, lookup
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel


def _model(norm=False):
    """0.weight (2x2), 0.bias (2), [1.weight, 1.bias, then 1.running_mean, 1.running_var], 3.weight (1x2),
    3.bias (1): a body and a linear head."""
    torch.manual_seed(0)
    mid = nn.BatchNorm1d(2) if norm else nn.Identity()
    return FlatModel(nn.Sequential(nn.Linear(2, 2), mid, nn.ReLU(), nn.Linear(2, 1)))


def _build(name, flat, **keys):
    cfg = config.from_dict({"algorithm": {"name": name, **keys}, "partition": {"clients": 2},
                            "server": {"clients_per_round": 2}})
    split = personal_split(cfg, flat)
    return lookup(name).create(cfg.algorithm, algorithm_context(cfg, flat.dim, flat.n_params, split=split))


def _round(algo, flat, x, trained, sizes=(1.0, 3.0)):
    """One REDUCE round as the round loop drives the hooks: each client starts (client_start, then its personal
    entries), "trains" to `trained[i]`, keeps its personal entries, accumulates; then the server update.
    Returns (the new x, the clients' start vectors)."""
    acc = torch.zeros(algo.dim, dtype=torch.float64)
    weight, starts = 0.0, []
    for cid, (y, n) in enumerate(zip(trained, sizes)):
        run = ClientRun(cid, 0, int(n))
        algo.client_start(run, x, flat)
        algo.load_personal(cid, flat)
        starts.append(flat.vec.clone())
        flat.vec.copy_(y)
        algo.keep_personal(cid, flat, x)
        weight += algo.accumulate(run, x, flat, acc)
    return server_update(algo, x, acc, weight), starts, acc


def test_fedper_keeps_the_head_and_averages_the_body_by_hand():
    flat = _model()
    algo = _build("fedper", flat)
    assert algo.split.names == ("3.weight", "3.bias")
    body, head = slice(0, 6), slice(6, 9)
    x = torch.zeros(9)
    y0, y1 = torch.arange(9.0), torch.full((9,), 4.0)
    new, starts, acc = _round(algo, flat, x, [y0, y1])
    # body: (1 * y0 + 3 * y1) / 4; head: x's (0), whatever the clients trained
    assert torch.equal(new[body], (y0[body] + 3 * y1[body]) / 4)
    assert torch.equal(new[head], x[head])
    assert torch.equal(acc[head], torch.zeros(3, dtype=torch.float64))      # nothing of the head was uploaded
    assert torch.equal(algo.personal_state[0], y0[head]) and torch.equal(algo.personal_state[1], y1[head])
    # its evaluation model: the new body and its own head; next round it starts from the same
    algo.eval_start(ClientRun(1, 1, 3), new, flat)
    assert torch.equal(flat.vec, torch.cat([new[body], y1[head]]))
    _, starts, _ = _round(algo, flat, new, [new, new])
    assert torch.equal(starts[0], torch.cat([new[body], y0[head]]))
    assert torch.equal(starts[1], torch.cat([new[body], y1[head]]))


def test_lgfedavg_keeps_the_body_and_averages_the_head_by_hand():
    flat = _model()
    algo = _build("lgfedavg", flat)
    assert algo.split.names == ("0.weight", "0.bias")
    body, head = slice(0, 6), slice(6, 9)
    x = torch.ones(9)
    y0, y1 = torch.arange(9.0), -torch.arange(9.0)
    new, _, _ = _round(algo, flat, x, [y0, y1])
    assert torch.equal(new[head], 1 + ((y0[head] - 1) + 3 * (y1[head] - 1)) / 4)
    assert torch.equal(new[body], x[body])
    assert torch.equal(algo.personal_state[1], y1[body])


def test_fedbn_keeps_the_norm_layers_parameters_and_statistics():
    flat = _model(norm=True)
    algo = _build("fedbn", flat)
    assert algo.split.names == ("1.weight", "1.bias", "1.running_mean", "1.running_var")
    personal = algo.split.personal_idx.tolist()
    assert personal == [6, 7, 8, 9, 13, 14, 15, 16]       # 1.weight, 1.bias, then the buffers after 3.*
    x = torch.zeros(flat.dim)
    y0, y1 = torch.arange(float(flat.dim)), torch.full((flat.dim,), 2.0)
    new, _, _ = _round(algo, flat, x, [y0, y1])
    shared = algo.split.shared_idx
    assert torch.equal(new[shared], (y0[shared] + 3 * y1[shared]) / 4)
    assert torch.equal(new[algo.split.personal_idx], torch.zeros(8))
    with pytest.raises(ConfigError, match="algorithm.name = 'fedbn' keeps nothing personal.*model.mlp_norm"):
        _build("fedbn", _model())          # no normalization layers: nothing personal, refused


def test_local_keeps_whole_models_and_never_aggregates():
    flat = _model()
    algo = _build("local", flat)
    assert algo.split is None and algo.wire_dim == 0
    x = torch.zeros(9)
    y0, y1 = torch.arange(9.0), torch.full((9,), 5.0)
    new, starts, acc = _round(algo, flat, x, [y0, y1])
    assert torch.equal(new, x) and not acc.any()             # no aggregation, nothing in the sums
    assert torch.equal(starts[0], x)                          # never trained: the broadcast x_0
    _, starts, _ = _round(algo, flat, x, [y0 + 1, y1 + 1])
    assert torch.equal(starts[0], y0) and torch.equal(starts[1], y1)      # its own model from its state
    algo.eval_start(ClientRun(0, 2, 1), x, flat)
    assert torch.equal(flat.vec, y0 + 1)


def test_models_that_lack_the_layers_they_need_are_refused():
    lr = FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(3, 2)))
    with pytest.raises(ConfigError, match="lgfedavg.*needs layers before the model's last linear layer"):
        _build("lgfedavg", lr)
    with pytest.raises(ConfigError, match="algorithm.name = 'fedper'.*match every parameter"):
        _build("fedper", lr)
    conv = FlatModel(nn.Sequential(nn.Conv2d(1, 2, 3)))
    with pytest.raises(ConfigError, match="algorithm.name = 'fedper' needs a model whose last layer is linear"):
        _build("fedper", conv)
    with pytest.raises(ConfigError, match="algorithm.name = 'fedper': pattern 'nothing.*' matches none"):
        _build("fedper", _model(), head=["nothing.*"])


def _tiny(algorithm, **model):
    from fedmpi.run.api import simulate

    return simulate({"seed": 2, "rounds": 3, "data": {"name": "synthetic"}, "partition": {"clients": 6},
                     "server": {"clients_per_round": 3}, "model": {"name": "mlp", "hidden": 8, **model},
                     "client": {"steps": 3}, "algorithm": algorithm, "runtime": {"progress": "off", "threads": 1}})


SPLIT_ALGORITHMS = sorted(name for name, cls in REGISTRY.items() if declares_personal_split(cls))


def test_the_registry_has_the_split_algorithms_it_is_known_to_have():
    assert {"fedper", "lgfedavg", "fedrep", "fedbn"} <= set(SPLIT_ALGORITHMS)
    assert "fedavg" not in SPLIT_ALGORITHMS and "ditto" not in SPLIT_ALGORITHMS


@pytest.mark.parametrize("name", SPLIT_ALGORITHMS)
def test_every_split_algorithm_refuses_a_rule_that_keeps_nothing_personal(name, monkeypatch):
    """Whatever makes the class's own rule select no entry (here its patterns emptied), set-up refuses it with
    one line naming the algorithm, and model.personal beside it does not make the run that algorithm's."""
    cls = lookup(name)
    monkeypatch.setattr(cls, "personal", ())
    monkeypatch.setattr(cls, "personal_patterns", classmethod(lambda c, keys, model: ()))
    for extra in ({}, {"personal": ["0.*"]}):
        cfg = config.from_dict({"algorithm": {"name": name}, "model": extra, "partition": {"clients": 2},
                                "server": {"clients_per_round": 2}})
        with pytest.raises(ConfigError, match=f"algorithm.name = '{name}' keeps nothing personal") as e:
            personal_split(cfg, _model(norm=True))
        assert len(str(e.value).splitlines()) == 1 and "algorithm.name = 'fedavg'" in str(e.value)


@pytest.mark.parametrize("name, keys, norm", [("lgfedavg", {"head": ["*"]}, False),
                                              ("lgfedavg", {"head": ["0.*", "3.*"]}, False),
                                              ("fedper", {"head": []}, False), ("fedbn", {}, False)])
def test_the_spellings_of_nothing_personal_are_refused_naming_the_key(name, keys, norm):
    """LG-FedAvg sharing every layer, FedPer with no head, FedBN on a model without normalization layers."""
    key = f"algorithm.head = {keys['head']}" if "head" in keys else f"algorithm.name = '{name}'"
    with pytest.raises(ConfigError, match=re.escape(key) + ".*keeps nothing personal"):
        _build(name, _model(norm), **keys)


def test_fedbn_with_normalization_layers_is_not_fedavg():
    assert not np.array_equal(_tiny({"name": "fedbn"}, mlp_norm="batch").model,
                              _tiny({"name": "fedavg"}, mlp_norm="batch").model)
