"""Adversarial clients (issue 25, fedmpi.attacks): each attack against a hand-computed case, honest clients
untouched, the malicious set and its record in run.h5, and the set-ups refused with exit 2. The -n 1 / -n 3
and resume checks are in tests/test_attacks_mpi.py."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import torch
from conftest import VecModel, small_config, tool_module, write_config

import fedmpi
from fedmpi import config
from fedmpi.attacks import malicious_clients
from fedmpi.attacks import model as attack_model
from fedmpi.attacks.data import (
    BACKDOOR_DRAW,
    DataPoison,
    backdoor_test_set,
    flip_mapping,
    poisoned_count,
    stamp,
    trigger_tokens,
)
from fedmpi.attacks.keys import AttackConfig
from fedmpi.attacks.stage import AttackStage
from fedmpi.cli import main
from fedmpi.core import rng
from fedmpi.uploads.base import ClientUpdate, StageView


def attacked(out="unused", rounds=1, **attack):
    """mnist5k, 12 clients, 5 per round (small_config) under `attack`."""
    return small_config(out, rounds=rounds, attack=attack)


# -- the malicious set ----------------------------------------------------------------------------------

def test_malicious_set_is_a_seeded_draw_of_round_fraction_n_clients():
    ids = malicious_clients(AttackConfig(name="sign_flip", fraction=0.25), 30, seed=7)
    assert len(ids) == 8 and list(ids) == sorted(set(ids.tolist()))        # round(0.25 * 30) = 8 distinct
    expected = np.sort(rng.stream(7, rng.ATTACK).choice(30, size=8, replace=False))
    assert np.array_equal(ids, expected)
    assert not np.array_equal(ids, malicious_clients(AttackConfig(name="sign_flip", fraction=0.25), 30, seed=8))
    explicit = malicious_clients(AttackConfig(name="gaussian", clients=[5, 1, 5]), 30, seed=7)
    assert explicit.tolist() == [1, 5]
    assert malicious_clients(AttackConfig(), 30, seed=7).size == 0


def test_run_h5_records_the_malicious_set_and_the_attack(tmp_path):
    out = tmp_path / "run"
    path = write_config(tmp_path / "c.yaml", attacked(str(out), name="scaling", fraction=0.25, scale=3.0))
    assert main(["run", str(path)]) == 0
    with h5py.File(out / "run.h5", "r") as f:
        ids = f["attack/malicious"][()]
        attrs = dict(f["attack"].attrs)
    assert np.array_equal(ids, malicious_clients(AttackConfig(name="scaling", fraction=0.25), 12, 1))
    assert len(ids) == 3
    assert attrs["name"] == "scaling" and attrs["scale"] == 3.0 and attrs["fraction"] == 0.25
    assert np.isnan(attrs["z"])


# -- label flipping -------------------------------------------------------------------------------------

def test_label_flip_maps_every_label_of_a_malicious_client_only():
    assert flip_mapping((), 4).tolist() == [3, 2, 1, 0]
    poison = DataPoison(AttackConfig(name="label_flip", clients=[2]), [2], seed=0, num_classes=4,
                        x_train=np.zeros((1, 3), np.float32))
    assert poison.for_client(0, 1) is None                                  # an honest client: untouched
    x, y = torch.ones(5, 3), torch.tensor([0, 1, 2, 3, 0])
    xb, yb = poison.for_client(0, 2)(x, y)
    assert yb.tolist() == [3, 2, 1, 0, 3] and torch.equal(xb, x)
    custom = DataPoison(AttackConfig(name="label_flip", mapping=[1, 1, 0, 2]), [0], 0, 4, np.zeros((1, 3)))
    assert custom.for_client(3, 0)(x, y)[1].tolist() == [1, 1, 0, 2, 1]


# -- the backdoor -----------------------------------------------------------------------------------------

def test_trigger_is_stamped_in_the_bottom_right_corner_of_every_channel():
    x = np.zeros((2, 3, 6, 5), np.float32)
    stamp(x, 2, 9.0)
    expected = np.zeros_like(x)
    expected[:, :, 4:6, 3:5] = 9.0
    assert np.array_equal(x, expected) and (x == 9.0).sum() == 2 * 3 * 2 * 2
    tokens = np.arange(20, dtype=np.int64).reshape(2, 10)
    stamp(tokens, 3, trigger_tokens(3, 80))
    assert tokens[:, -3:].tolist() == [[79, 78, 77]] * 2 and tokens[:, :7].tolist() == [list(range(7)),
                                                                                        list(range(10, 17))]
    flat = np.zeros((1, 6), np.float32)
    assert stamp(flat, 2, 1.5).tolist() == [[0, 0, 0, 0, 1.5, 1.5]]


def test_backdoor_stamps_the_seeded_poison_fraction_of_each_batch_with_the_target():
    attack = AttackConfig(name="backdoor", clients=[4], target=7, poison_fraction=0.3, trigger_size=2)
    x_train = np.full((3, 1, 5, 5), 2.5, np.float32)
    x_train[0, 0, 0, 0] = 4.0                                  # the brightest training input: the trigger's value
    poison = DataPoison(attack, [4], seed=11, num_classes=10, x_train=x_train)
    assert poison.for_client(2, 3) is None
    batch_fn = poison.for_client(2, 4)
    g = rng.stream(11, rng.ATTACK, 2, 4, BACKDOOR_DRAW)         # what the client's own attack stream draws
    for size in (10, 10, 7):                                     # three batches, the last one short
        x = torch.zeros(size, 1, 5, 5)
        y = torch.arange(size) % 5
        xb, yb = batch_fn(x, y)
        k = poisoned_count(size, 0.3)
        assert k == {10: 3, 7: 2}[size]                          # 0.3 * 7 = 2.1 -> 2
        pos = np.sort(g.choice(size, size=k, replace=False))
        hit = np.zeros(size, bool)
        hit[pos] = True
        assert yb[hit].tolist() == [7] * k and torch.equal(yb[~hit], y[~hit])
        patch = torch.zeros(1, 5, 5)
        patch[:, 3:, 3:] = 4.0
        assert all(torch.equal(xb[i], patch) for i in pos) and torch.equal(xb[~hit], x[~hit])
        assert torch.equal(x, torch.zeros(size, 1, 5, 5))      # the gathered batch itself is not changed


def test_backdoor_test_set_is_every_non_target_sample_triggered_with_the_target_label():
    x = np.zeros((6, 1, 4, 4), np.float32)
    y = np.array([0, 1, 2, 1, 0, 2])
    xb, yb = backdoor_test_set(x, y, AttackConfig(name="backdoor", target=1, trigger_size=1), np.float32(3.0))
    assert len(yb) == 4 and yb.tolist() == [1] * 4
    assert np.all(xb[:, 0, 3, 3] == 3.0) and xb.sum() == 4 * 3.0 and x.sum() == 0


# -- model poisoning --------------------------------------------------------------------------------------

def test_model_attacks_on_a_known_update():
    update = torch.tensor([1.0, -2.0, 0.5])
    assert attack_model.sign_flip(update).tolist() == [-1.0, 2.0, -0.5]
    assert attack_model.sign_flip(update, 2.0).tolist() == [-2.0, 4.0, -1.0]
    assert attack_model.scaling(update, 3.0).tolist() == [3.0, -6.0, 1.5]
    noise = attack_model.poisoned_update(AttackConfig(name="gaussian", sigma=0.5), update, 3, 5, 9)
    expected = rng.stream(3, rng.ATTACK, 5, 9, attack_model.GAUSSIAN_DRAW).standard_normal(3, dtype=np.float32)
    assert torch.equal(noise, torch.from_numpy(expected * np.float32(0.5)))


@pytest.mark.parametrize("name, expected", [("sign_flip", [0.0, 3.0, 1.0]), ("scaling", [2.0, -3.0, 1.0])])
def test_attack_stage_replaces_only_a_malicious_clients_update(name, expected):
    stage = AttackStage(AttackConfig(name=name, scale=2.0), [4], seed=0, dim=3)
    down = torch.tensor([1.0, 0.0, 1.0, 99.0])               # the payload may carry more than the model
    honest, malicious = VecModel(3), VecModel(3)
    honest.vec.copy_(torch.tensor([1.5, -1.5, 1.0]))
    malicious.vec.copy_(torch.tensor([1.5, -1.5, 1.0]))      # update (0.5, -1.5, 0)
    for cid, model in ((3, honest), (4, malicious)):
        update = stage.client(ClientUpdate(cid, 0, model.vec, down[:3], 10.0), StageView(None))
        assert update.vector is model.vec and update.weight == 10.0     # the malicious client keeps its weight
    assert honest.vec.tolist() == [1.5, -1.5, 1.0]
    assert malicious.vec.tolist() == expected


# -- end to end, in one process -----------------------------------------------------------------------------

@pytest.mark.parametrize("attack", [{"name": "label_flip"}, {"name": "backdoor", "scale": 2.0},
                                    {"name": "sign_flip"}])
def test_honest_clients_train_exactly_as_without_attack(attack):
    """Round 0 starts every client from x0: an honest client's loss must be bit-identical to the clean run's,
    a malicious one's must differ (data attacks) and the global models must differ."""
    cfg = attacked(clients=[2, 3, 6], **attack)
    clean, dirty = fedmpi.simulate(small_config("unused", rounds=1)), fedmpi.simulate(cfg)
    trained = np.isfinite(clean.clients["loss"][0])
    honest = trained.copy()
    honest[[2, 3, 6]] = False
    assert honest.sum() >= 2 and trained[[2, 3, 6]].sum() >= 1                   # both kinds in round 0
    assert np.array_equal(clean.clients["loss"][0][honest], dirty.clients["loss"][0][honest])
    if attack["name"] != "sign_flip":
        bad = trained.copy()
        bad[honest] = False
        assert not np.any(clean.clients["loss"][0][bad] == dirty.clients["loss"][0][bad])
    assert not np.array_equal(clean.model, dirty.model)


def test_backdoor_accuracy_is_logged_and_rises_under_the_attack():
    result = fedmpi.simulate(attacked(rounds=3, name="backdoor", fraction=0.25, target=0, scale=2.0))
    bd = result.metrics["backdoor_acc"]
    clean = fedmpi.simulate(small_config("unused", rounds=1, attack={"name": "backdoor", "clients": [11],
                                                                     "target": 0}))
    assert bd.shape == (3,) and np.all((bd >= 0) & (bd <= 1))
    assert bd[-1] > 0.5 > clean.metrics["backdoor_acc"][0]


def test_batched_clients_are_poisoned_like_the_per_client_loop():
    """client.vectorize = on trains the malicious clients' poisoned batches in the group (to float tolerance
    of the loop, as any batched group)."""
    cfg = attacked(rounds=1, name="backdoor", clients=[2, 3], poison_fraction=0.5)
    cfg["server"] = {"clients_per_round": 12}
    loop = fedmpi.simulate(cfg, **{"client.vectorize": "off"})
    group = fedmpi.simulate(cfg, **{"client.vectorize": "on"})
    np.testing.assert_allclose(group.clients["loss"], loop.clients["loss"], rtol=1e-4)
    np.testing.assert_allclose(group.model, loop.model, atol=1e-5)
    clean = fedmpi.simulate(small_config("unused", rounds=1, server={"clients_per_round": 12}),
                            **{"client.vectorize": "on"})
    assert np.abs(clean.clients["loss"][0][[2, 3]] - group.clients["loss"][0][[2, 3]]).min() > 1e-3


# -- set-ups that cannot run: exit 2 before anything is written -----------------------------------------------

REFUSED = {
    "target": ({"name": "backdoor", "target": 10}, {}, r"attack.target = 10: must be a label .* \(0..9\)"),
    "trigger": ({"name": "backdoor", "trigger_size": 29}, {}, r"attack.trigger_size = 29: larger than the "
                                                               r"image side .* use at most 28"),
    "mapping_length": ({"name": "label_flip", "mapping": [1, 0]}, {}, r"attack.mapping: must list the new label "
                                                                      r"of each of the 10 labels"),
    "mapping_label": ({"name": "label_flip", "mapping": [0, 1, 2, 3, 4, 5, 6, 7, 8, 12]}, {},
                      r"invalid labels \[12\]"),
    "omniscient": ({"name": "alie"}, {"algorithm": {"name": "scaffold"}},
                   r"attack.name = 'alie': an omniscient attack .* needs an algorithm whose upload is one vector"),
    "two_vectors": ({"name": "sign_flip"}, {"algorithm": {"name": "scaffold"}},
                    r"algorithm.name = 'scaffold' uploads 2 vectors per client \(up_vectors\)"),
    "boost_two_vectors": ({"name": "backdoor", "scale": 5.0}, {"algorithm": {"name": "scaffold"}},
                          r"with attack.scale = 5.0: algorithm.name = 'scaffold' uploads 2 vectors"),
    "route": ({"name": "gaussian"}, {"algorithm": {"name": "fedskip"}}, r"uploads by the 'route' protocol"),
    "missing_client": ({"name": "sign_flip", "clients": [12]}, {}, r"attack.clients: client 12 does not exist"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_attack_set_ups_that_cannot_run_are_refused(case):
    attack, extra, reason = REFUSED[case]
    cfg = small_config("unused", rounds=1, attack=attack, **extra)
    with pytest.raises(config.ConfigError, match=reason) as info:
        fedmpi.simulate(cfg)
    assert info.value.exit_code == 2


def test_fraction_one_and_a_refused_run_exit_2_before_anything_is_written(tmp_path, capsys):
    with pytest.raises(config.ConfigError, match=r"attack.fraction"):
        config.from_dict(small_config("unused", attack={"name": "label_flip", "fraction": 1.0}))
    out = tmp_path / "out"
    path = write_config(tmp_path / "c.yaml", small_config(str(out), attack={"name": "backdoor", "target": 10}))
    assert main(["run", str(path)]) == 2
    assert "attack.target" in capsys.readouterr().err
    assert not out.exists() or sorted(os.listdir(out)) == [".fedmpi.lock"]
    assert main(["run", str(path), "--dry-run"]) == 2
    ok = write_config(tmp_path / "ok.yaml", small_config(str(out), attack={"name": "backdoor", "clients": [3, 1]}))
    capsys.readouterr()
    assert main(["run", str(ok), "--dry-run"]) == 0
    assert "attack: backdoor, 2 malicious clients: 1, 3" in capsys.readouterr().out


# -- fedmpi report --attack and export ----------------------------------------------------------------------

def test_last_evaluation_and_tail_mean():
    from fedmpi.analysis.attack_report import last_and_tail

    values = [0.1, np.nan, 0.3] + [np.nan] * 16 + [0.5, 0.7]      # 21 rounds: the tail is the last 3
    assert last_and_tail(values) == (0.7, 0.6)
    last, tail = last_and_tail([0.2, 0.4, np.nan])          # the tail (the last round) was not evaluated
    assert last == 0.4 and np.isnan(tail)
    last, tail = last_and_tail([np.nan, np.nan])
    assert np.isnan(last) and np.isnan(tail)


def test_report_attack_and_export_carry_backdoor_accuracy(tmp_path, capsys):
    out = tmp_path / "bd"
    path = write_config(tmp_path / "c.yaml", attacked(str(out), rounds=3, name="backdoor", fraction=0.25))
    assert main(["run", str(path)]) == 0
    with h5py.File(out / "run.h5", "r") as f:
        bd, acc = f["metrics/backdoor_acc"][()], f["metrics/test_acc"][()]
    capsys.readouterr()
    assert main(["report", str(out), "--attack"]) == 0
    table = capsys.readouterr().out.split("attacks:")[1].splitlines()
    header, row = table[1].split(), table[3].split()
    assert header == ["run", "attack", "malicious", "test_acc_last", "test_acc_tail", "backdoor_acc_last",
                      "backdoor_acc_tail"]
    # 3 rounds: the last 10% is the last round, so last and tail agree
    assert row == ["bd", "backdoor", "3", f"{acc[-1]:.4f}", f"{acc[-1]:.4f}", f"{bd[-1]:.4f}", f"{bd[-1]:.4f}"]
    csv_path = tmp_path / "m.csv"
    assert main(["export", str(out), "--csv", str(csv_path)]) == 0
    assert "backdoor_acc" in csv_path.read_text().splitlines()[0].split(",")


# -- the robustness study's judgements (tools/robustness.py) --------------------------------------------------

def load_robustness():
    return tool_module("robustness", "attacks")


def test_robustness_claims_are_judged_on_the_cells():
    tool = load_robustness()
    cells = {}
    for partition in tool.PARTITIONS:
        for attack in tool.ATTACKS:
            for aggregator in tool.AGGREGATORS:
                cells[(partition, attack, aggregator)] = {"acc": [0.80, 0.82], "backdoor": [np.nan, np.nan]}
    cells[("IID", "sign flip x4", "FedAvg")] = {"acc": [0.30, 0.32], "backdoor": [np.nan] * 2}   # 0.31 - 0.1 < 0.36
    cells[("IID", "ALIE", "median")] = {"acc": [0.70, 0.70], "backdoor": [np.nan] * 2}           # 11 points lost
    cells[("Dir(0.1)", "no attack", "Krum")] = {"acc": [0.70, 0.72], "backdoor": [np.nan] * 2}   # 10 below FedAvg
    cells[("IID", "backdoor", "median")] = {"acc": [0.8, 0.8], "backdoor": [0.9, 0.85]}
    cells[("Dir(0.1)", "label flip", "FedAvg")] = {"acc": [0.74, 0.78], "backdoor": [np.nan] * 2}   # 5 points: a tie
    cells[("Dir(0.1)", "backdoor", "median")] = {"acc": [0.8, 0.8], "backdoor": [0.6, 0.6]}
    cells[("IID", "ALIE", "Krum")] = {"acc": [], "backdoor": [], "absent": [("x", "refused", "folder in use")]}
    for partition in tool.PARTITIONS:
        cells[(partition, "backdoor", "Krum")] = {"acc": [0.8, 0.8], "backdoor": [0.1, 0.2]}
    judged = {claim: holds for holds, claim, _ in tool.verdicts(cells)}

    def holds(start):
        (value,) = [h for claim, h in judged.items() if claim.startswith(start)]
        # "does not hold" carries its cause: the gap against the claim beyond the seeds' spread
        if value and value.startswith("does not hold"):
            assert value.startswith("does not hold (the gap -") and "exceeds the seeds' spread" in value, value
            return "does not hold"
        return value

    yes, no = "holds", "does not hold"      # beyond the seeds' spread either way; within it: not decided
    assert holds("FedAvg breaks under sign flip x4 (IID") == yes
    assert holds("FedAvg breaks under sign flip x4 (Dir(0.1)") == no
    assert holds("FedAvg breaks under sign flip (IID") == no
    assert holds("ALIE evades median (IID") == yes and holds("ALIE evades median (Dir(0.1)") == no
    assert holds("ALIE evades Krum (IID") is None                              # refused: not judged
    skew = {name: holds(f"{name} loses accuracy under strong label skew") for name in
            ("median", "trimmed mean", "Krum", "FLTrust")}
    assert skew == {"median": no, "trimmed mean": no, "Krum": yes, "FLTrust": no}
    assert holds("median does not stop the backdoor") == yes and holds("Krum does not stop") == no
    assert holds("20% label flippers cost FedAvg little (IID") == yes
    assert holds("20% label flippers cost FedAvg little (Dir(0.1)").startswith("not decided at this scale (tied")
    assert holds("FLTrust does not stop") is None                           # no backdoor accuracy measured
    assert tool.tail_mean([0.1] * 18 + [0.5, 0.7]) == pytest.approx(0.6)      # the last 10% of 20 rounds


def test_reproduce_keeps_the_robustness_section():
    module = tool_module("reproduce", "attacks")
    block = "<!-- robustness -->\n## Robustness\nKEPT\n<!-- /robustness -->"
    text = module.assemble("# old\n<!-- paper:zhao -->\nZHAO\n<!-- /paper:zhao -->\n\n" + block + "\n", {})
    assert text.count(block) == 1 and text.index("ZHAO") < text.index(block)
