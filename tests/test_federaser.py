"""unlearning.method: federaser (fedmpi.unlearning): each counted client's update rescaled to the norm of its
recorded update at original round j * every; the set-up refusals; one in-process replay of a recorded run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import small_config, write_config

from fedmpi.cli import main
from fedmpi.config import from_dict
from fedmpi.core.errors import ConfigError
from fedmpi.unlearning.federaser import FedEraserStage, calibrated, problems
from fedmpi.unlearning.keys import UnlearningConfig
from fedmpi.uploads.base import ClientUpdate
from fedmpi.uploads.record import UpdateRecorder, rank_file
from fedmpi.uploads.recorded import update_norms


def test_calibration_keeps_the_direction_and_takes_the_recorded_length():
    out = calibrated(torch.tensor([3.0, 4.0]), 10.0)             # |(3, 4)| = 5: scaled by 2
    assert torch.equal(out, torch.tensor([6.0, 8.0]))
    assert torch.equal(calibrated(torch.tensor([0.0, -2.0]), 0.5), torch.tensor([0.0, -0.5]))
    zero = torch.zeros(3)
    assert torch.equal(calibrated(zero, 7.0), zero)             # no direction: stays zero


def test_the_stage_writes_start_plus_the_calibrated_update_into_the_vector():
    stage = FedEraserStage({0: {}, 1: {2: 10.0}})
    vector = torch.tensor([4.0, 5.0])
    update = ClientUpdate(cid=2, round=1, vector=vector, start=torch.tensor([1.0, 1.0]), weight=3.0)
    passed = stage.client(update, view=None)
    assert passed.vector is vector                              # in place, as the memory rules ask
    assert torch.equal(vector, torch.tensor([7.0, 9.0]))        # (1, 1) + 10 * (3, 4) / 5
    assert passed.weight == 3.0


def test_the_section_checks_its_own_keys():
    assert UnlearningConfig().inert and not UnlearningConfig("federaser", "o").inert
    with pytest.raises(ConfigError, match="unlearning.original = None: method federaser replays"):
        UnlearningConfig(method="federaser")
    with pytest.raises(ConfigError, match="unlearning.every = 0: must be a positive integer"):
        UnlearningConfig(method="federaser", original="o", every=0)
    with pytest.raises(ConfigError, match="unlearning.original = 'o': is read by unlearning.method: federaser"):
        UnlearningConfig(original="o")
    with pytest.raises(ConfigError, match="unlearning.method = 'fedeaser': must be one of none, federaser"):
        from_dict({"unlearning": {"method": "fedeaser", "original": "o"}})
    assert from_dict({}).hash() == from_dict({"unlearning": {"every": 3}}).hash()      # inert: out of the hash


def recording(folder, rounds):
    """A hand-made recording in `folder`: {round: [cid, ...]} with each delta (cid + 1, 0): norm cid + 1."""
    recorder = UpdateRecorder(rank_file(folder, 1))
    for t, cids in rounds.items():
        for cid in cids:
            recorder.client(ClientUpdate(cid=cid, round=t, vector=torch.tensor([cid + 1.0, 0.0]),
                                         start=torch.zeros(2), weight=1.0), None)
    return folder


def checked(unlearning, rounds, clients=3, per_round=3, counted=(0, 1, 2), protocol="reduce"):
    return problems(unlearning, rounds=rounds, clients=clients, clients_per_round=per_round, counted=set(counted),
                    protocol=protocol, algorithm_name="fedavg")


def test_set_up_refuses_what_federaser_cannot_replay(tmp_path):
    original = recording(tmp_path / "orig", {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 2], 3: [0, 1, 2]})
    every2 = UnlearningConfig("federaser", str(original), every=2)
    assert checked(UnlearningConfig(), rounds=50) == []
    assert checked(every2, rounds=1) == []
    assert checked(every2, rounds=2, counted=(0, 2)) == []      # round 2 lacks client 1, which is left out
    [line] = checked(every2, rounds=2)
    assert "has no recorded update of round 2 client 1" in line
    [line] = checked(every2, rounds=3)                          # replays round 4 of rounds 0..3
    assert "rounds = 3 with every = 2 replays original round 4" in line and "set rounds <= 2" in line
    lines = checked(every2, rounds=1, per_round=2, protocol="buffer")
    assert any("uploads by 'buffer'" in line for line in lines)
    assert any("server.clients_per_round = partition.clients (3); it is 2" in line for line in lines)
    [line] = checked(UnlearningConfig("federaser", str(tmp_path / "nowhere")), rounds=1)
    assert line.startswith(f"unlearning.original = '{tmp_path / 'nowhere'}':")
    assert "no recorded client updates" in line


def test_a_federaser_replay_rescales_each_update_to_the_recorded_norm(tmp_path, capsys):
    """The original (4 clients, all in every round, 4 rounds, 10 local steps) records its updates; the
    replay forgets client 0 with every = 2 and 5 local steps, and records its own: each counted client's
    update has the norm the original recorded for it at round 2j (the float32 rounding of start + update
    aside)."""
    shared = {"partition": {"clients": 4, "scheme": "dirichlet", "beta": 0.5}, "server": {"clients_per_round": 4},
              "checkpoint": {"updates": True}}
    original = tmp_path / "original"
    cfg = small_config(original, rounds=4, client={"lr": 0.05, "batch_size": 20, "steps": 10}, **shared)
    assert main(["run", str(write_config(tmp_path / "original.yaml", cfg))]) == 0
    unlearned = tmp_path / "unlearned"
    cfg = small_config(unlearned, rounds=2, client={"lr": 0.05, "batch_size": 20, "steps": 5},
                       unlearning={"method": "federaser", "original": str(original), "every": 2},
                       counterfactual={"drop": [0]}, **shared)
    path = write_config(tmp_path / "unlearned.yaml", cfg)
    assert main(["run", str(path)]) == 0
    recorded, replayed = update_norms(original), update_norms(unlearned)
    assert sorted(replayed) == [0, 1]
    for j, norms in replayed.items():
        assert {1, 2, 3} <= set(norms) <= {0, 1, 2, 3}          # client 0 counts nowhere once drop is applied
        for cid, norm in norms.items():
            assert math.isclose(norm, recorded[2 * j][cid], rel_tol=1e-6)
    assert not all(math.isclose(replayed[1][c], recorded[1][c], rel_tol=1e-3) for c in (1, 2, 3))
    capsys.readouterr()
    assert main(["run", str(path), "rounds=3", "--overwrite"]) == 2
    assert "set rounds <= 2" in capsys.readouterr().err
    assert np.isfinite(list(replayed[1].values())).all()
