"""The walk-throughs of docs/how-to/own-algorithm.md, each one file under examples/, run as out-of-tree algorithms:
`examples.fedadam_scratch:FedAdamScratch` must equal `server.optimizer: adam` with fedavg, and
`examples.control_variates:ControlVariates` fedmpi's `scaffold`, under mpiexec -n 3 (the shared launch of
tests/extension_runs.py) and in-process on the regression problem; the doc shows the files as they are.
"""

from __future__ import annotations

import re

import extension_runs as ext
import h5py
import numpy as np
import pytest
import regression_problem as rp
from conftest import ROOT, read_global, read_metrics

from fedmpi import config
from fedmpi.algorithms.registry import lookup
from fedmpi.core.errors import ConfigError

SCRATCH = "examples.fedadam_scratch:FedAdamScratch"
CONTROL = "examples.control_variates:ControlVariates"
ADAM_KEYS = {"lr": 0.05, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}


@pytest.fixture(scope="module")
def runs(request):
    return ext.shared(request)


@pytest.fixture
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


# --- under mpiexec -n 3 ---------------------------------------------------------------------------------------

@pytest.mark.mpi
def test_fedadam_from_scratch_equals_the_adam_server_optimizer(runs):
    scratch, attrs = read_metrics(runs["scratch"])
    adam, _ = read_metrics(runs["adam"])
    assert attrs["status"] == "finished" and attrs["algorithm"] == SCRATCH
    np.testing.assert_allclose(scratch["test_loss"], adam["test_loss"], rtol=1e-5)
    np.testing.assert_allclose(read_global(runs["scratch"]), read_global(runs["adam"]), rtol=1e-5, atol=1e-6)
    with h5py.File(runs["scratch"] / "ckpt" / f"ckpt-{ext.R}.h5", "r", locking=False) as f:
        # the example's moments are the algorithm's server state; it uses no server optimizer state
        assert f["server/m"].dtype == np.float64 and np.any(f["server/m"][()] != 0)
        assert "optimizer" not in f or len(f["optimizer"]) == 0


@pytest.mark.mpi
def test_control_variates_equals_scaffold(runs):
    example, attrs = read_metrics(runs["control_variates"])
    scaffold, _ = read_metrics(runs["scaffold"])
    assert attrs["status"] == "finished" and example["test_acc"][-1] > 0.5
    assert np.array_equal(example["bytes_up"], scaffold["bytes_up"])           # two vectors each way
    assert np.array_equal(example["bytes_down"], scaffold["bytes_down"])
    np.testing.assert_allclose(example["test_loss"], scaffold["test_loss"], rtol=1e-5)
    np.testing.assert_allclose(read_global(runs["control_variates"]), read_global(runs["scaffold"]),
                               rtol=1e-5, atol=1e-6)
    with h5py.File(runs["control_variates"] / "ckpt" / f"ckpt-{ext.R}.h5", "r", locking=False) as f:
        assert np.any(f["server/c"][()] != 0) and len(f["clients"]) > 0
        assert all("c_i" in f["clients"][cid] for cid in f["clients"])


# --- in-process, on the regression problem (a model with a float buffer) ----------------------------------------

def test_fedadam_from_scratch_equals_adam_on_a_model_with_a_buffer(importable):
    cfg = rp.config(SCRATCH)
    cfg["algorithm"].update(ADAM_KEYS)      # (the algorithm's `lr`, not the clients')
    scratch = rp.simulate(cfg)
    adam = rp.simulate(rp.config("fedavg", server={"optimizer": "adam", "lr": 0.05, "betas": [0.9, 0.99],
                                                   "tau": 1e-3}))
    np.testing.assert_allclose(scratch.model, adam.model, rtol=1e-6, atol=1e-7)
    assert scratch.model[3] == rp.BUFFER
    assert not np.allclose(scratch.model, rp.simulate(rp.config("fedavg")).model, rtol=1e-3)


def test_control_variates_equals_scaffold_and_the_reference(importable):
    example = rp.simulate(rp.config(CONTROL))
    rp.assert_model(example.model, rp.scaffold_reference()[0][-1])
    np.testing.assert_allclose(example.model, rp.simulate(rp.config("scaffold")).model, rtol=1e-6, atol=1e-7)


def test_the_examples_keep_their_contract(importable):
    scratch, control = lookup(SCRATCH), lookup(CONTROL)
    assert scratch.vectorizable and not scratch.uses_server_optimizer and not scratch.keeps_client_state
    assert control.keeps_client_state and (control.down_vectors, control.up_vectors) == (2, 2)
    # FedAdam applies its own server step: another server optimizer on top is refused, naming the key
    with pytest.raises(ConfigError, match="server.optimizer"):
        scratch.check(config.from_dict(rp.config(SCRATCH, server={"optimizer": "adam"})), None)
    with pytest.raises(ConfigError, match=r"algorithm\.beta1 = 1\.5"):
        config.from_dict(rp.config(SCRATCH, beta1=1.5))


def test_the_doc_shows_each_example_file_as_it_is():
    doc = (ROOT / "docs" / "how-to" / "own-algorithm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    for name in ("fedadam_scratch.py", "control_variates.py"):
        assert (ROOT / "examples" / name).read_text() in blocks, \
            f"docs/how-to/own-algorithm.md does not show examples/{name}"
