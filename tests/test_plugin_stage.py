"""An upload stage from outside fedmpi (issue 37): docs/how-to/own-algorithm.md's walk-through 6,
examples/norm_clip_stage.py,
run by `uploads.stages: [examples.norm_clip_stage:NormClip]` with no edit under fedmpi/. Its transform by hand, a
whole run at its limit (a bound no update reaches: FedAvg bit for bit) and below it, and the contract a
plug-in stage is held to (exit 2)."""

from __future__ import annotations

import re

import extension_runs as ext
import numpy as np
import pytest
import torch
from conftest import ROOT, small_config

import fedmpi
from fedmpi.cli import main
from fedmpi.core.errors import ConfigError
from fedmpi.plans.base import RoundPlan
from fedmpi.uploads.base import ClientUpdate, StageSetting, StageView
from fedmpi.uploads.catalog import stage_class
from fedmpi.uploads.keys import UploadsConfig

CLIP = "examples.norm_clip_stage:NormClip"


@pytest.fixture
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def _with(base, **keys):
    return {**base, "uploads": {"stages": [CLIP], "keys": keys}}


def test_the_transform_by_hand(importable):
    uploads = UploadsConfig(stages=(CLIP,), keys={"max_norm": 2.5})
    stage = stage_class(CLIP, ("uploads",)).build(StageSetting(None, 3), uploads=uploads)
    start, vector = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([4.0, 5.0, 1.0])     # delta (3, 4, 0): norm 5
    update = stage.client(ClientUpdate(3, 0, vector, start, 7.0), StageView(None))
    assert update.vector is vector and torch.equal(vector, torch.tensor([2.5, 3.0, 1.0]))   # start + delta / 2
    assert update.weight == 7.0 and update.scalars == {"norm_clip": (1.0, 1.0)}
    assert update.figures == {"clip_factor": 0.5}
    small = stage.client(ClientUpdate(4, 0, torch.tensor([1.0, 2.0, 1.0]), start, 1.0), StageView(None))
    assert small.scalars == {"norm_clip": (0.0, 1.0)} and small.figures == {"clip_factor": 1.0}
    plan = RoundPlan(0, np.arange(2), np.arange(2))
    sums = torch.tensor([9.0, 1.0, 2.0], dtype=torch.float64)
    out, weight, metrics = stage.server(sums, 8.0, StageView(plan, (), sums[1:]))
    assert out is sums and weight == 8.0 and metrics == {"norm_clip_fraction": 0.5}


def test_a_whole_run_at_its_limit_is_fedavg_and_below_it_clips_every_upload(importable, tmp_path):
    base = small_config(tmp_path, rounds=2)
    plain = fedmpi.simulate(base)
    loose = fedmpi.simulate(_with(base, max_norm=1e9))
    assert np.array_equal(loose.model, plain.model)         # no update reaches the bound: FedAvg's bits
    assert np.all(loose.metrics["norm_clip_fraction"] == 0)
    tight = fedmpi.simulate(_with(base, max_norm=1e-3))
    assert np.all(tight.metrics["norm_clip_fraction"] == 1) and not np.array_equal(tight.model, plain.model)
    factors = tight.clients["clip_factor"][tight.clients["selected"] == 1]
    assert np.all((factors > 0) & (factors < 1))
    # Each round moves the model by at most the bound: a weighted mean of updates of norm <= max_norm.
    assert np.linalg.norm(tight.model - fedmpi.simulate(base, rounds=0).model) <= 2 * 1e-3 * (1 + 1e-5)


def test_the_plug_in_is_held_to_its_declarations(importable, tmp_path, monkeypatch):
    base = small_config(tmp_path, rounds=1)
    with pytest.raises(ConfigError, match=r"uploads.keys.bound = 2: is not read by any of uploads.stages"):
        fedmpi.simulate(_with(base, bound=2))
    with pytest.raises(ConfigError, match=r"does not declare works_with_dp"):
        fedmpi.simulate({**_with(base), "privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0}})
    with pytest.raises(ConfigError, match=r"upload stages apply to uploads summed by the reduce protocol"):
        fedmpi.simulate({**_with(base), "algorithm": {"name": "fedskip"}})
    (tmp_path / "badstages.py").write_text(
        "from fedmpi.uploads.base import UploadStage\n"
        "class NoBuild(UploadStage):\n    name = 'x'\n"
        "class Unordered(UploadStage):\n    name, order = 'y', 'first'\n"
        "class ReadsAll(UploadStage):\n    name, reads = 'z', ('everything',)\n"
        "class NotOne:\n    name = 'w'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, message in [("NoBuild", "does not define build"), ("Unordered", r"order must be an int"),
                          ("ReadsAll", r"reads must be a tuple of config sections"),
                          ("NotOne", "not a subclass of fedmpi.uploads.base.UploadStage")]:
        with pytest.raises(ConfigError, match=message):
            stage_class(f"badstages:{name}", ("seed", "uploads"))


def test_dry_run_refuses_as_set_up_does(importable, tmp_path, capsys):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_with(small_config(tmp_path / "out", rounds=1), bound=2)))
    assert main(["run", str(path), "--dry-run"]) == 2
    assert "uploads.keys.bound" in capsys.readouterr().err


def test_the_doc_shows_the_example_file_as_it_is():
    doc = (ROOT / "docs" / "how-to" / "own-algorithm.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert (ROOT / "examples" / "norm_clip_stage.py").read_text() in blocks


@pytest.mark.mpi
def test_mpiexec_n3_gives_the_in_process_model_and_resumes_bit_identically(importable, request, tmp_path_factory):
    ext.assert_n3_is_in_process_and_resumes("norm_clip", request, tmp_path_factory)
