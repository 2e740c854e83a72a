"""A server optimizer from outside fedmpi (issue 37): docs/how-to/own-algorithm.md's walk-through 5,
examples/nesterov.py,
run by `server.optimizer: examples.nesterov:Nesterov` with no edit under fedmpi/. Its step against torch's own
Nesterov SGD, its limit (momentum 0 is FedAvg's step) on a whole in-process run, its moments in the checkpoints
and a bit-identical --resume under mpiexec -n 3 (the shared launch of tests/extension_runs.py), and the contract
it is held to (exit 2 naming the key)."""

from __future__ import annotations

import re

import extension_runs as ext
import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT, read_global, read_metrics, small_config

import fedmpi
from fedmpi import config
from fedmpi.core.errors import ConfigError
from fedmpi.round.server_opt import check_optimizer, optimizer_class

NESTEROV = "examples.nesterov:Nesterov"


@pytest.fixture
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def test_the_step_is_torchs_nesterov_sgd(importable):
    """torch.optim.SGD(nesterov=True) on a parameter whose gradient is -u takes the same steps (the server's
    update u is a descent direction; its lr the server's)."""
    server = config.from_dict({"server": {"optimizer": NESTEROV, "momentum": 0.7}}).server
    opt = optimizer_class(NESTEROV)(server, 4, 3)       # 3 trainable entries, 1 buffer
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, generator=g)
    ref = torch.nn.Parameter(x[:3].double().clone())
    torch_opt = torch.optim.SGD([ref], lr=0.4, momentum=0.7, nesterov=True)
    for _ in range(3):
        u = torch.randn(4, generator=g, dtype=torch.float64)
        buffer_before = float(x[3])
        x = opt.step(x.clone(), u, 0.4)
        ref.grad = -u[:3].clone()
        torch_opt.step()
        np.testing.assert_allclose(x[:3].numpy(), ref.detach().numpy(), rtol=1e-6)
        assert float(x[3]) == pytest.approx(buffer_before + float(u[3]), rel=1e-6)    # buffers: the average


def test_at_momentum_0_a_whole_run_is_fedavg(importable, tmp_path):
    base = small_config(tmp_path, rounds=3)
    plain = fedmpi.simulate(base)
    plug = fedmpi.simulate({**base, "server": {"clients_per_round": 5, "optimizer": NESTEROV, "momentum": 0.0}})
    np.testing.assert_allclose(plug.model, plain.model, rtol=1e-6, atol=1e-7)
    moving = fedmpi.simulate({**base, "server": {"clients_per_round": 5, "optimizer": NESTEROV, "momentum": 0.9}})
    assert not np.allclose(moving.model, plain.model, rtol=1e-4)


def test_the_plug_in_is_held_to_its_declarations(importable, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"server.tau = 0.5: is not used by server.optimizer"):
        check_optimizer(config.from_dict({"server": {"optimizer": NESTEROV, "tau": 0.5}}).server)
    (tmp_path / "badopts.py").write_text(
        "from fedmpi.round.server_opt import ServerOptimizer\n"
        "class NoStep(ServerOptimizer):\n    name = 'x'\n"
        "class NotOne:\n    name = 'y'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"NoStep does not define step"):
        optimizer_class("badopts:NoStep")
    with pytest.raises(ConfigError, match=r"not a subclass of fedmpi.round.server_opt.ServerOptimizer"):
        optimizer_class("badopts:NotOne")
    with pytest.raises(ConfigError, match=r"server.optimizer = 'adamm': unknown \(did you mean 'adam'\?\)"):
        config.from_dict({"server": {"optimizer": "adamm"}})


@pytest.mark.mpi
def test_its_moments_survive_a_resume_at_n3(request):
    runs = ext.shared(request)
    whole, attrs = read_metrics(runs["nesterov"])
    resumed, _ = read_metrics(runs["nesterov-resumed"])
    assert attrs["status"] == "finished" and whole["test_acc"][-1] > 0.5
    assert np.array_equal(read_global(runs["nesterov"]), read_global(runs["nesterov-resumed"]))
    assert np.array_equal(whole["test_loss"], resumed["test_loss"])
    with h5py.File(runs["nesterov"] / "ckpt" / f"ckpt-{ext.R}.h5", "r", locking=False) as f:
        m = f["optimizer/m"][()]
        assert m.dtype == np.float64 and np.any(m != 0)


def test_the_doc_shows_the_example_file_as_it_is():
    doc = (ROOT / "docs" / "how-to" / "own-algorithm.md").read_text()
    assert (ROOT / "examples" / "nesterov.py").read_text() in re.findall(r"```python\n(.*?)```", doc, flags=re.S)
