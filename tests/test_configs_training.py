"""The experiment configs in jobs/configs/, the papers' learning rates (issue 13 item 4): every paper config and
each of its variants, once per distinct training setup, trains on a learnable stand-in of its data set without
blowing up. Split from tests/test_configs.py by topic (validation, the papers' numbers, the big configs on
full-size stand-ins and the small configs end to end there)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from test_configs import PAPER, rel, variants

from fedmpi import config
from fedmpi.core.models import build_model
from fedmpi.data import sources
from fedmpi.data.dataset import Dataset

# --- the papers' learning rates train (issue 13 item 4) ---------------------------------------------------

def training_setups():
    """Every paper config and each of its variants, once per distinct training setup: data set, model, client
    and server settings, and the algorithm (by name: a variant that changes only its keys, a split or the
    number of clients repeats a setup)."""
    seen, params = set(), []
    for path in PAPER:
        for name, overrides in [("config", [])] + list(variants(path).items()):
            cfg = check_config(config.load(path, overrides))
            d = cfg.to_dict()
            key = yaml.safe_dump({"data": d["data"]["name"], "model": d["model"], "client": d["client"],
                                  "server": d["server"], "algorithm": d["algorithm"]["name"]}, sort_keys=True)
            if key not in seen:
                seen.add(key)
                params.append(pytest.param(path, overrides, id=f"{rel(path)}:{name}"))
    return params


CHECK_CLIENTS, CHECK_BATCH, CHECK_SERVER_SET = 2, 16, 64
# Inputs of the stand-in as small as the model allows (simple_cnn needs 16 x 16), so that a step is cheap, and
# local steps per round: ResNet-18 (momentum 0.9 at lr 0.01) needs six to show progress, the others three.
CHECK_SIDE = {"simple_cnn": 16, "cnn2": 12, "cnn_mnist": 12, "resnet18": 8}
CHECK_STEPS = {"resnet18": 6}
BLOW_UP = 1.25      # a test loss above this multiple of the untrained model's is divergence


def check_config(cfg):
    """The config of a three-round check: the config's own learning rates and their schedules, momentum, weight
    decay, drop_last, server step size and optimizer, and algorithm keys. Every client takes part: as many
    as the config's clients per round where the server's step size is not 1 (eta_g = sqrt(S) is only as
    stable as S averaged updates make it), else CHECK_CLIENTS, on an IID split with an IID server set (the
    question is the step sizes, not the skew); a few local steps (CHECK_STEPS) of at most CHECK_BATCH samples;
    pretraining and warm-up cut to 2 epochs, the server's set to CHECK_SERVER_SET samples."""
    d = cfg.to_dict()
    s = cfg.server.clients_per_round if cfg.server.lr != 1.0 else min(cfg.server.clients_per_round, CHECK_CLIENTS)
    d.update(rounds=3, out="runs/check")
    d["runtime"] = {"threads": 1, "progress": "off"}
    # aligned updates (iid): the harshest case for a server step size; the other schemes' keys, which iid does
    # not read, are dropped (they would be refused)
    d["partition"] = {"scheme": cfg.partition.scheme if cfg.partition.scheme == "natural" else "iid",
                      "clients": s, "samples_per_client": None}
    d["server"]["clients_per_round"] = s
    d["client"].update(batch_size=min(cfg.client.batch_size, CHECK_BATCH), epochs=1,
                       steps=CHECK_STEPS.get(cfg.model.name, 3), vectorize="off")
    if cfg.server_data.wanted:
        d["server_data"] = {"size": CHECK_SERVER_SET, "source": cfg.server_data.source, "scheme": "iid"}
    for key in ("pretrain_epochs", "warmup_epochs"):
        if d["algorithm"].get(key):
            d["algorithm"][key] = 2
    return config.from_dict(d)


def learnable_stand_in(cfg, per_client):
    """A small data set of the config's kind that a model can learn in a few steps: images (CHECK_SIDE[model]
    square, the real channels, at most 10 classes) scattered around one random template per class; token
    sequences whose label is their last token (Shakespeare); SYNTHETIC itself. Natural users: one per client."""
    clients = cfg.partition.clients
    if cfg.data.name == "synthetic":
        natural = config.PartitionConfig(clients=clients, scheme="natural", samples_per_client=per_client)
        return sources.synthetic(cfg.data, cfg.seed, natural)
    g = np.random.default_rng(0)
    n_train = clients * per_client + 2 * CHECK_SERVER_SET
    n_test = 200
    if cfg.data.name == "shakespeare":
        classes = 80
        x = g.integers(0, classes, (n_train + n_test, 80))
        y = x[:, -1].copy()
    else:
        channels = {"cifar10": 3, "cifar100": 3}.get(cfg.data.name, 1)
        classes = min(cfg.data.classes or 10, 10)    # a few steps cannot learn CIFAR-100's 100 classes
        y = np.concatenate([g.permutation(np.arange(n) % classes) for n in (n_train, n_test)])   # balanced
        side = CHECK_SIDE[cfg.model.name]
        templates = g.normal(size=(classes, channels, side, side))
        x = (templates[y] + 0.5 * g.normal(size=(len(y), channels, side, side))).astype(np.float32)
    users = None
    if cfg.partition.scheme == "natural":
        users = [np.arange(u * per_client, (u + 1) * per_client) for u in range(clients)]
    return Dataset(cfg.data.name, x[:n_train], y[:n_train].astype(np.int64), x[n_train:], y[n_train:].astype(np.int64),
                   classes, users=users)


@pytest.mark.parametrize("path, overrides", training_setups())
def test_paper_learning_rates_train_in_the_first_rounds(path, overrides):
    """Each paper setup, scaled down on a learnable stand-in, trains rather than diverges in its first three
    rounds: every loss finite (a non-finite one ends the run as diverged), no test loss above BLOW_UP times
    the untrained model's, and progress: the last round's training loss below the first round's, or the
    final test loss below the untrained model's (a few small steps may show only one of the two)."""
    import fedmpi
    from fedmpi.core import rng
    from fedmpi.core.train import evaluate

    cfg = check_config(config.load(path, overrides))     # (training_setups already checked it loads)
    ds = learnable_stand_in(cfg, per_client=3 * cfg.client.batch_size)
    rng.seed_torch(cfg.seed, rng.INIT)
    untrained = build_model(cfg.model, ds.input_shape, ds.num_classes)
    _, before = evaluate(untrained, torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test), 1000)
    result = fedmpi.simulate(cfg, dataset=ds)
    m = result.metrics
    assert np.isfinite(m["train_loss"]).all(), m["train_loss"]
    measured = m["test_loss"][~np.isnan(m["test_loss"])]
    assert len(measured) and np.isfinite(measured).all()
    assert measured.max() < BLOW_UP * before, (before, m["test_loss"])
    assert m["train_loss"][-1] < m["train_loss"][0] or measured[-1] < before, (before, m["test_loss"],
                                                                                m["train_loss"])
