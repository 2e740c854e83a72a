"""Personal parameters (issue 24): the ParameterSplit, the patterns' refusals, and the round loop's handling of a
client's personal entries (kept at home, never uploaded, not counted in the bytes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedmpi import config
from fedmpi.algorithms import personal_split
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.core.personal import ParameterSplit, split_model


def _mlp():
    torch.manual_seed(0)
    # 0.weight (4x3), 0.bias (4), 1.weight (4), 1.bias (4), 3.weight (2x4), 3.bias (2); buffers of 1 follow
    return FlatModel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)))


def test_entries_name_every_block_in_vector_order():
    flat = _mlp()
    names = [n for n, _, _ in flat.entries]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias",
                     "1.running_mean", "1.running_var"]
    offsets = [o for _, o, _ in flat.entries]
    sizes = [k for _, _, k in flat.entries]
    assert offsets == list(np.cumsum([0] + sizes[:-1]))
    assert sum(sizes) == flat.dim == 12 + 4 + 4 + 4 + 8 + 2 + 4 + 4
    # the entries are the parameters' own values
    w = dict(flat.module.named_parameters())["3.weight"]
    _, off, n = flat.entries[4]
    assert torch.equal(flat.vec[off:off + n], w.reshape(-1))


def test_split_indices_shared_personal_and_merge_on_a_hand_case():
    s = ParameterSplit.from_mask(torch.tensor([0, 1, 1, 0, 1], dtype=torch.bool))
    assert s.shared_idx.tolist() == [0, 3] and s.personal_idx.tolist() == [1, 2, 4]
    assert (s.shared_dim, s.personal_dim) == (2, 3) and bool(s)
    v = torch.tensor([10., 11., 12., 13., 14.])
    assert s.shared(v).tolist() == [10., 13.] and s.personal(v).tolist() == [11., 12., 14.]
    out = torch.zeros(5)
    s.merge(torch.tensor([1., 4.]), torch.tensor([2., 3., 5.]), out)
    assert out.tolist() == [1., 2., 3., 4., 5.]
    s.put_personal(out, torch.zeros(3))
    assert out.tolist() == [1., 0., 0., 4., 0.]
    assert not ParameterSplit.none(5) and ParameterSplit.none(5).shared_dim == 5


def test_split_model_union_of_sources_and_its_refusals():
    flat = _mlp()
    s = split_model(flat.entries, flat.dim, (("model.personal", ("3.*",)), ("algorithm.name = 'x'", ("1.*",))))
    assert s.names == ("1.weight", "1.bias", "3.weight", "3.bias", "1.running_mean", "1.running_var")
    assert s.personal_dim == 4 + 4 + 8 + 2 + 4 + 4 and s.shared_dim == 16
    with pytest.raises(ConfigError, match=r"model.personal: pattern 'head\.\*' matches none"):
        split_model(flat.entries, flat.dim, (("model.personal", ("head.*",)),))
    with pytest.raises(ConfigError, match="model.personal.*match every parameter"):
        split_model(flat.entries, flat.dim, (("model.personal", ("*",)),))


def test_personal_split_from_the_config_and_the_protocol_refusal():
    flat = _mlp()
    cfg = config.from_dict({"model": {"personal": ["3.*"]}})
    assert personal_split(cfg, flat).personal_dim == 10
    assert personal_split(config.from_dict({}), flat) is None
    with pytest.raises(ConfigError, match="model.personal: personal parameters need an algorithm of the REDUCE"):
        personal_split(config.from_dict({"model": {"personal": ["3.*"]}, "algorithm": {"name": "fedbuff"}}), flat)
    with pytest.raises(ConfigError, match="model.personal"):
        config.from_dict({"model": {"personal": [""]}})


def _tiny(**extra):
    cfg = {"seed": 3, "rounds": 3, "data": {"name": "synthetic"}, "partition": {"clients": 6},
           "server": {"clients_per_round": 3}, "model": {"name": "mlp", "hidden": 8},
           "client": {"steps": 3, "batch_size": 10}, "eval": {"every": 3},
           "runtime": {"progress": "off", "threads": 1}}
    for key, value in extra.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def test_personal_entries_stay_home_and_bytes_shrink_by_their_size():
    from fedmpi.run.api import simulate

    plain = simulate(_tiny())
    res = simulate(_tiny(model={"personal": ["5.*"]}))
    exp = res.experiment
    split = exp.algo.split
    assert split.personal_dim == 8 * 10 + 10        # the output layer of mlp(hidden 8) on 10 classes
    # bytes: exactly the personal part's float32 size less, per upload and per broadcast
    per_round = 3 * 4 * split.personal_dim
    assert np.array_equal(plain.metrics["bytes_up"] - res.metrics["bytes_up"], np.full(3, per_round))
    assert np.array_equal(plain.metrics["bytes_down"] - res.metrics["bytes_down"], np.full(3, per_round))
    # the server's copy of the personal entries never moved from x_0; the shared ones did
    from fedmpi.core import rng
    from fedmpi.core.models import build_model

    rng.seed_torch(3, rng.INIT)
    x0 = FlatModel(build_model(exp.cfg.model, exp.dataset.input_shape, exp.dataset.num_classes)).vec
    x = torch.from_numpy(res.model)
    assert torch.equal(split.personal(x), split.personal(x0))
    assert not torch.equal(split.shared(x), split.shared(x0))
    # every client that trained keeps its own personal entries, which differ from x_0's
    trained = np.flatnonzero(np.nansum(res.clients["selected"], axis=0) > 0)
    assert sorted(exp.algo.personal_state) == sorted(trained.tolist())
    for cid in trained:
        assert not torch.equal(exp.algo.personal_state[int(cid)], split.personal(x0))


def test_bad_patterns_exit_2_before_any_file(tmp_path):
    import yaml

    from fedmpi.cli import main as fedmpi_main

    cfg = _tiny(model={"personal": ["head.*"]})
    cfg["out"] = str(tmp_path / "run")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert fedmpi_main(["run", str(path), "--dry-run"]) == 2
    assert fedmpi_main(["run", str(path)]) == 2
    assert fedmpi_main(["run", str(path), "model.personal=[]", "algorithm.name=lgfedavg", "model.name=lr"]) == 2
    assert not (tmp_path / "run" / "run.h5").exists()
