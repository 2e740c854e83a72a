"""The experiment configs in jobs/configs/: every one validates, the papers' settings are what the papers
say, the big ones split and build on full-size stand-ins of their data sets, the small ones dry-run and
run end to end under MPI. That the papers' learning rates train is tests/test_configs_training.py.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import session_runs
import torch
import yaml
from conftest import ROOT, tool_module

from fedmpi import config
from fedmpi.algorithms import SetupContext, build_algorithm, lookup
from fedmpi.algorithms.registry import builtin_names
from fedmpi.cli import main as fedmpi_main
from fedmpi.core.flat import FlatModel
from fedmpi.core.models import BUILDERS, build_model
from fedmpi.data import sources
from fedmpi.data.dataset import Dataset
from fedmpi.data.partition import SCHEMES
from fedmpi.data.server_set import resolved_size, split_dataset

CONFIGS = ROOT / "jobs" / "configs"
ALL = sorted(CONFIGS.rglob("*.yaml"))
SMALL = sorted((CONFIGS / "small").glob("*.yaml"))
REPRO = sorted((CONFIGS / "repro").rglob("*.yaml"))
LOCAL_DATA = ("mnist5k", "synthetic")          # need no files
PAPER = [p for p in ALL if p.relative_to(CONFIGS).parts[0] in ("fsl", "fedskip", "datashare", "safl")]
VARIANT = re.compile(r"^# variant ([\w-]+): (.+)$")


def rel(path):
    return str(Path(path).relative_to(CONFIGS))


def variants(path):
    """{name: [override, ...]} from the config's `# variant NAME: OVERRIDES` lines."""
    found = {}
    for line in Path(path).read_text().splitlines():
        m = VARIANT.match(line)
        if m:
            assert m.group(1) not in found, f"{rel(path)}: variant {m.group(1)} twice"
            found[m.group(1)] = shlex.split(m.group(2))
    return found


def test_the_expected_configs_exist():
    names = {rel(p) for p in ALL}
    expected = {"quickstart.yaml", "fsl/cifar10_s1.yaml", "fsl/emnist_s1.yaml", "fsl/cifar10_s2.yaml",
                "fsl/emnist_s2.yaml", "datashare/cifar10_1class.yaml", "safl/mnist.yaml", "safl/mnist_gated.yaml"}
    expected |= {f"fedskip/{d}_p{n}.yaml" for d in ("cifar10", "cifar100") for n in (10, 50, 100)}
    expected |= {f"fedskip/{d}.yaml" for d in ("femnist", "shakespeare", "synthetic")}
    assert expected <= names
    assert len(SMALL) >= 8
    assert {p.parent.name for p in REPRO} == {"zhao", "fsl", "fedskip", "fedskip_shakespeare", "safl"}


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_config_validates_and_names_exist(path):
    cfg = config.load(path)
    assert cfg.algorithm.name in builtin_names()
    assert cfg.model.name in BUILDERS
    assert cfg.data.name in sources.LOADERS
    assert cfg.partition.scheme in SCHEMES
    assert cfg.out.startswith("runs/")


@pytest.mark.parametrize("path", [p for p in ALL if variants(p)], ids=rel)
def test_variant_lines_validate(path):
    for name, overrides in variants(path).items():
        cfg = config.load(path, overrides)
        assert cfg.algorithm.name in builtin_names(), name


@pytest.mark.parametrize("path", PAPER + SMALL, ids=rel)
def test_paper_and_small_configs_offer_their_fedavg_baseline(path):
    cfg = config.load(path)
    names = {config.load(path, o).algorithm.name for o in variants(path).values()} | {cfg.algorithm.name}
    assert "fedavg" in names


# --- the papers' numbers ---------------------------------------------------------------------------------

def load(name):
    return config.load(CONFIGS / name)


@pytest.mark.parametrize("name, data, clients, per_client, server", [
    ("fsl/cifar10_s1.yaml", "cifar10", 10, 5000, 500), ("fsl/emnist_s1.yaml", "emnist", 45, 2400, 225),
    ("fsl/cifar10_s2.yaml", "cifar10", 1000, 50, None), ("fsl/emnist_s2.yaml", "emnist", 450, 240, None)])
def test_fsl_configs_hold_the_papers_settings(name, data, clients, per_client, server):
    cfg = load(name)
    assert (cfg.data.name, cfg.partition.clients, cfg.partition.samples_per_client) == (data, clients, per_client)
    assert cfg.partition.scheme == "classes" and cfg.client.epochs == 1
    assert cfg.server.lr == pytest.approx(math.sqrt(cfg.server.clients_per_round), rel=1e-6)   # eta_g = sqrt(S)
    assert cfg.rounds == 1000 and cfg.algorithm.pretrain_epochs == 500 and cfg.algorithm.pretrain_lr == 0.01
    if server:      # scenario 1: a small IID server set
        assert (cfg.server_data.size, cfg.server_data.scheme) == (server, "iid")
    else:           # scenario 2: a non-IID one
        assert cfg.server_data.scheme != "iid"
    if data == "emnist":
        assert cfg.data.classes == 45


@pytest.mark.parametrize("data, n, rounds", [("cifar10", 10, 200), ("cifar10", 50, 800), ("cifar10", 100, 800),
                                             ("cifar100", 10, 200), ("cifar100", 50, 800), ("cifar100", 100, 1200)])
def test_fedskip_configs_hold_the_papers_settings(data, n, rounds):
    cfg = load(f"fedskip/{data}_p{n}.yaml")
    p = cfg.partition
    assert (cfg.data.name, p.clients, p.scheme, p.beta) == (data, n, "dirichlet", 0.5)
    assert cfg.server.clients_per_round == (n if n == 10 else n // 5)      # P50, P100: 20% per round
    assert cfg.rounds == rounds and cfg.algorithm.delta == 3
    c = cfg.client
    assert (c.lr, c.batch_size, c.epochs, c.momentum, c.weight_decay) == (0.01, 64, 10, 0.9, 1e-5)


@pytest.mark.parametrize("name, clients, rounds, prox, dyn", [("femnist", 180, 200, 0.001, 0.0001),
                                                              ("shakespeare", 660, 200, 0.001, 0.0001),
                                                              ("synthetic", 212, 1000, 0.001, 0.001)])
def test_fedskip_real_world_configs_hold_the_papers_settings(name, clients, rounds, prox, dyn):
    path = CONFIGS / "fedskip" / f"{name}.yaml"
    cfg = config.load(path)
    assert (cfg.data.name, cfg.partition.clients, cfg.partition.scheme) == (name, clients, "natural")
    assert cfg.server.clients_per_round == 10 and cfg.rounds == rounds and cfg.algorithm.delta == 3
    c = cfg.client
    assert (c.lr, c.batch_size, c.epochs, c.momentum, c.weight_decay) == (0.01, 64, 10, 0.9, 1e-5)
    found = {v: config.load(path, o).algorithm for v, o in variants(path).items()}
    assert found["fedprox"].mu == prox and found["feddyn"].alpha == dyn
    assert ("moon" in found) == (name == "femnist")      # the paper has no MOON on Shakespeare; no head on LR


@pytest.mark.parametrize("path", sorted((CONFIGS / "fedskip").glob("*.yaml")), ids=rel)
def test_fedskip_baselines_train_the_same_net_with_their_reference_rules(path):
    """Every method of a FedSkip config trains one model (MOON's projection head for all, as the authors'
    code builds them), SCAFFOLD and MOON with the rules of the code the paper's baselines come from."""
    base = config.load(path)
    for name, overrides in variants(path).items():
        cfg = config.load(path, overrides)
        assert cfg.model == base.model, name
        if cfg.algorithm.name == "scaffold":
            assert (cfg.algorithm.correction, cfg.algorithm.initial_controls) == ("after_step", "model_init")
        if cfg.algorithm.name == "moon":
            assert cfg.algorithm.first_round == "model_init" and cfg.model.projection == 256
    assert base.client.drop_last == (base.data.name in ("cifar10", "cifar100"))   # the code's CIFAR loaders


def test_data_sharing_config_holds_zhao_et_al_settings():
    cfg = load("datashare/cifar10_1class.yaml")
    assert (cfg.partition.clients, cfg.partition.scheme, cfg.partition.shards_per_client) == (10, "shards", 1)
    s = cfg.server_data
    assert (s.source, s.holdout, s.fraction, s.scheme, s.classes) == ("holdout", 10000, 0.1, "classes", 10)
    assert resolved_size(s, 50000) == 4000                   # beta = 10% of D = 40,000
    assert cfg.algorithm.alpha == 0.5 and cfg.server.clients_per_round == 10 and cfg.client.lr == 0.1
    assert (cfg.client.lr_schedule.name, cfg.client.lr_schedule.gamma) == ("exponential", 0.992)
    assert cfg.algorithm.warmup_target_acc == 0.6
    sweep = {v: config.load(CONFIGS / "datashare" / "cifar10_1class.yaml", o).server_data
             for v, o in variants(CONFIGS / "datashare" / "cifar10_1class.yaml").items() if v.startswith("beta")}
    assert {v: d.fraction for v, d in sweep.items()} == {"beta5": 0.05, "beta20": 0.2}
    assert all(d.holdout == 10000 for d in sweep.values())    # the clients' data stays the same


def test_safl_configs_run_safl_on_mnist():
    plain, gated = load("safl/mnist.yaml"), load("safl/mnist_gated.yaml")
    assert plain.data.name == gated.data.name == "mnist"
    assert plain.algorithm.name == gated.algorithm.name == "safl"
    assert not plain.algorithm.gating and gated.algorithm.gating


# --- the big configs on full-size stand-ins of their data sets -------------------------------------------

# (train per class, test per class, input shape, classes) of the real data sets.
MNIST_TRAIN = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
FULL_SIZE = {
    "cifar10": ([5000] * 10, [1000] * 10, (3, 32, 32)),
    "cifar100": ([500] * 100, [100] * 100, (3, 32, 32)),
    "emnist": ([2400] * 47, [400] * 47, (1, 28, 28)),
    "mnist": (MNIST_TRAIN, MNIST_TEST, (1, 28, 28)),
}


# LEAF sets with natural users: (users, training samples per user, test samples, input shape, classes, dtype);
# the users are as many as the FedSkip paper keeps, their sizes a round stand-in.
NATURAL = {"femnist": (180, 200, 4000, (1, 28, 28), 62, np.float32),
           "shakespeare": (660, 100, 6600, (80,), 80, np.uint8)}      # token ids as the loader gives them


def stand_in(cfg):
    """The data set with its real class counts and input shape; the inputs are zeros that take no memory
    (the split needs only the labels). data.classes is applied as load_dataset would."""
    zeros = lambda n, shape, dtype=np.float32: np.broadcast_to(np.zeros((1, *shape), dtype), (n, *shape))  # noqa: E731
    g = np.random.default_rng(0)
    if cfg.data.name in NATURAL:
        users, per_user, n_test, shape, classes, dtype = NATURAL[cfg.data.name]
        if cfg.partition.scheme == "natural":       # a reduced set (jobs/configs/repro/fedskip_shakespeare)
            users = cfg.partition.clients
        y_train = g.integers(0, classes, users * per_user)
        y_test = g.integers(0, classes, n_test)
        split = [np.arange(u * per_user, (u + 1) * per_user) for u in range(users)]
        return Dataset(cfg.data.name, zeros(len(y_train), shape, dtype), y_train, zeros(n_test, shape, dtype), y_test,
                       classes, users=split)
    train, test, shape = FULL_SIZE[cfg.data.name]
    classes = cfg.data.classes or len(train)
    y_train = g.permutation(np.repeat(np.arange(classes), train[:classes]))
    y_test = np.repeat(np.arange(classes), test[:classes])
    return Dataset(cfg.data.name, zeros(len(y_train), shape), y_train, zeros(len(y_test), shape), y_test, classes)


def with_base_folder(cfg, tmp_path):
    """`cfg`, its model.path (a folder tools/pretrain_char_lm.py writes, absent from a fresh checkout) replaced by a
    fresh model of the tool's default shape saved in `tmp_path`, so the config's own keys are built and checked."""
    if not cfg.model.path or os.path.isdir(cfg.model.path):
        return cfg
    import torch

    tool = tool_module("pretrain_char_lm")
    args = tool.parse(["--out", str(tmp_path / "unused")])
    torch.manual_seed(0)
    tool.build_model(args, max(1, args.n_embd // 32), torch).save_pretrained(tmp_path / "base")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(tmp_path / "base")))


@pytest.mark.parametrize("path", [p for p in ALL if config.load(p).data.name not in LOCAL_DATA], ids=rel)
def test_big_config_splits_and_builds_on_its_full_size_data(path, tmp_path):
    cfg = with_base_folder(config.load(path), tmp_path)
    assert cfg.data.name in FULL_SIZE or cfg.data.name in NATURAL
    ds = stand_in(cfg)
    split = split_dataset(ds, cfg.partition, cfg.server_data, cfg.seed, cfg.eval.local_every)
    sizes = np.array([len(p) for p in split.parts])
    assert len(sizes) == cfg.partition.clients and sizes.min() >= 1
    if cfg.partition.samples_per_client:
        assert np.all(sizes == cfg.partition.samples_per_client)
    assert len(split.server_idx) == resolved_size(cfg.server_data, len(ds.y_train))
    if cfg.server_data.source == "holdout":
        assert not np.intersect1d(np.concatenate(split.parts), split.server_idx).size
    module = build_model(cfg.model, ds.input_shape, ds.num_classes, cfg.lora)
    module.eval()
    with torch.no_grad():
        x = torch.zeros(2, *ds.input_shape, dtype=torch.from_numpy(ds.x_train[:1].copy()).dtype)
        assert module(x).shape == (2, ds.num_classes)
    flat = FlatModel(module)
    lookup(cfg.algorithm.name).check(cfg, flat)
    build_algorithm(cfg, flat.dim, flat.n_params).setup(SetupContext(sizes, split.server_idx, flat.vec.clone()))


# --- the small configs: dry run and end to end -----------------------------------------------------------

LOCAL = [p for p in ALL if config.load(p).data.name in LOCAL_DATA]


@pytest.fixture(scope="module")
def mnist5k():
    cfg = config.from_dict({"data": {"name": "mnist5k"}})
    return sources.mnist5k(cfg.data)


@pytest.mark.parametrize("path", LOCAL, ids=rel)
def test_local_data_config_dry_runs(path, mnist5k, monkeypatch, capsys):
    # The mnist5k file is parsed once for all of them; everything after loading is the real dry run.
    monkeypatch.setitem(sources.LOADERS, "mnist5k", lambda data, seed, partition: mnist5k)
    assert fedmpi_main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    clients = config.load(path).partition.clients
    assert f"clients: {clients}," in out and "server set:" in out


def test_dry_run_command_line():
    proc = subprocess.run([sys.executable, "-m", "fedmpi", "run", "jobs/configs/small/fsl_s1.yaml", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "clients: 10," in proc.stdout and "server set: 40 samples" in proc.stdout


@session_runs.plan
def small_config_runs(base):
    """Every config of jobs/configs/small at -n 3 (tests/session_runs.py: in the launch shared with other
    files)."""
    steps = []
    for path in SMALL:
        mapping = yaml.safe_load(path.read_text())
        mapping.update(rounds=3, out=str(base / path.stem))     # 3: one FedSkip period (delta 3)
        mapping["runtime"] = {"threads": 1, "progress": "off"}
        (base / path.name).write_text(yaml.safe_dump(mapping))
        steps.append(["run", base / path.name, "--overwrite"])
    return {3: steps}, base


@pytest.fixture(scope="module")
def small_runs(request):
    return session_runs.result(request, small_config_runs)


@pytest.mark.mpi
def test_small_configs_run_end_to_end(small_runs):
    tmp_path = small_runs
    for path in SMALL:
        with h5py.File(tmp_path / path.stem / "run.h5", "r", locking=False) as f:
            assert f.attrs["status"] == "finished", path.name
            acc = f["metrics/test_acc"][()]
        assert len(acc) == 3 and 0 < acc[-1] <= 1, path.name
