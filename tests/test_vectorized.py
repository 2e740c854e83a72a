"""Batched client groups (`client.vectorize`, fedmpi.core.vectorized) give the per-client loop's results.

In process (LocalComm), then once end to end under mpiexec. Equality is to float tolerance: batched kernels
may add in another order (for the linear model they happen to give identical bits).
"""

import numpy as np
import pytest
import session_runs
import torch
import yaml
from conftest import ROOT, read_global, read_metrics, write_config
from torch import nn

import fedmpi
from fedmpi import config
from fedmpi.core import rng, vectorized
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel
from fedmpi.core.train import LocalTrainer, Schedule
from fedmpi.data.augment import pad_crop_flip
from fedmpi.mpi.local import LocalComm
from fedmpi.run.setup import experiment

RTOL, ATOL = 1e-5, 1e-6


def synthetic(out="unused", **sections):
    """SYNTHETIC(1,1) with 40 users of 37 samples (batch 10: a last batch of 7), 16 selected per round."""
    cfg = {"seed": 3, "rounds": 3, "out": str(out),
           "data": {"name": "synthetic", "alpha": 1.0, "beta": 1.0},
           "partition": {"clients": 40, "scheme": "natural", "samples_per_client": 37},
           "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 10, "epochs": 1},
           "server": {"clients_per_round": 16}, "runtime": {"threads": 1, "progress": "off"}}
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    return cfg


def run_inprocess(mapping, vectorize):
    """(the Experiment, its SimulationResult) through the in-process API."""
    mapping = {**mapping, "client": {**mapping["client"], "vectorize": vectorize}}
    result = fedmpi.simulate(mapping)
    return result.experiment, result


def assert_same_training(loop, batched):
    (_, a), (_, b) = loop, batched
    np.testing.assert_allclose(b.model, a.model, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(b.metrics["train_loss"], a.metrics["train_loss"], rtol=RTOL)
    np.testing.assert_array_equal(b.metrics["uploads"], a.metrics["uploads"])
    np.testing.assert_array_equal(b.clients["selected"], a.clients["selected"])
    np.testing.assert_allclose(b.clients["loss"], a.clients["loss"], rtol=RTOL, atol=ATOL)
    assert np.nanmax(np.abs(b.metrics["test_acc"] - a.metrics["test_acc"])) <= 1e-3


# -- the trainer itself ----------------------------------------------------------------------------

def _client_sets(n_train, sizes, seed=0):
    g = np.random.default_rng(seed)
    return [np.sort(g.choice(n_train, size=s, replace=False)).astype(np.int64) for s in sizes]


@pytest.mark.parametrize("momentum,wd,steps", [(0.0, 0.0, None), (0.9, 0.01, None), (0.5, 0.0, 9)])
def test_group_trainer_equals_local_trainer(momentum, wd, steps):
    torch.manual_seed(0)
    cfg = config.ClientConfig(lr=0.1, batch_size=8, momentum=momentum, weight_decay=wd, steps=steps)
    x, y = torch.randn(300, 12), torch.randint(0, 5, (300,))
    flat = FlatModel(nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 5)))
    start = flat.vec.clone()
    parts = _client_sets(300, [21] * 5)          # 21 = 8 + 8 + 5: the loss of the last batch is over 5
    sched = Schedule(8, steps or 3)
    loop = LocalTrainer(flat, cfg, x, y)
    expected = []
    for cid, part in enumerate(parts):
        flat.load(start)
        loss_sum, seen = loop.train(torch.from_numpy(part), rng.stream(1, rng.CLIENT, 0, cid), sched)
        expected.append((flat.vec.clone(), float(loss_sum), seen))
    group = vectorized.GroupTrainer(flat, cfg, x, y)
    weights, loss_sums, seen = group.train(start, [(p, rng.stream(1, rng.CLIENT, 0, c)) for c, p in enumerate(parts)],
                                           sched)
    for i, (vec, loss_sum, n_seen) in enumerate(expected):
        torch.testing.assert_close(weights[i], vec, rtol=RTOL, atol=ATOL)
        assert loss_sums[i].item() == pytest.approx(loss_sum, rel=RTOL)
        assert seen == n_seen


def test_group_trainer_with_convolutions_and_augmentation():
    """A small CNN with pad-crop-flip drawn from each client's own generator, as in the loop."""
    torch.manual_seed(1)
    cfg = config.ClientConfig(lr=0.05, batch_size=4)
    x, y = torch.randn(64, 3, 16, 16), torch.randint(0, 3, (64,))
    module = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                           nn.Linear(4 * 8 * 8, 3))
    flat = FlatModel(module)
    start = flat.vec.clone()
    parts = _client_sets(64, [10] * 3, seed=2)
    sched = Schedule(4, 3)
    loop = LocalTrainer(flat, cfg, x, y, transform=pad_crop_flip)
    expected = []
    for cid, part in enumerate(parts):
        flat.load(start)
        loop.train(torch.from_numpy(part), rng.stream(2, rng.CLIENT, 5, cid), sched)
        expected.append(flat.vec.clone())
    group = vectorized.GroupTrainer(flat, cfg, x, y, transform=pad_crop_flip)
    weights, _, _ = group.train(start, [(p, rng.stream(2, rng.CLIENT, 5, c)) for c, p in enumerate(parts)], sched)
    for i, vec in enumerate(expected):
        torch.testing.assert_close(weights[i], vec, rtol=RTOL, atol=ATOL)


GROUP_MODELS = {      # a chain of dense layers (batched matrix products) and a CNN (vmap's grouped convolutions)
    "dense_chain": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 5)), (3, 4, 4)),
    "vmap_cnn": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 5)), (3, 4, 4)),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("model", list(GROUP_MODELS))
def test_a_clients_batched_result_does_not_depend_on_its_group(model, threads):
    """Which clients share a batched group depends on which rank hosts them, so at -n 1 a client may train
    among 10 and at -n 3 among 5, or alone: its parameters and loss must be the same bits in every group of
    any size, at a fixed thread count (a group of one once took other kernels: vmap's at 1 thread, MKL's
    multi-threaded GEMM for a batch of one at 2)."""
    build, shape = GROUP_MODELS[model]
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(200, *shape, generator=gen), torch.randint(0, 5, (200,), generator=gen)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(6)
        flat = FlatModel(build())
    cfg = config.ClientConfig(lr=0.1, batch_size=8, momentum=0.5)
    parts = _client_sets(200, [21] * 6, seed=7)
    sched = Schedule(8, 6)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        group = vectorized.GroupTrainer(flat, cfg, x, y)
        assert (group.chain is not None) == (model == "dense_chain")

        def train(cids):
            return group.train(flat.vec.clone(), [(parts[c], rng.stream(1, rng.CLIENT, 0, c)) for c in cids], sched)

        all_w, all_loss, _ = train(range(6))
        for cids in ([0], [3], [1, 4], [5, 0, 2], [2, 3, 4, 5]):
            w, loss, _ = train(cids)
            assert w.shape[0] == len(cids)
            for i, c in enumerate(cids):
                assert torch.equal(w[i], all_w[c]) and torch.equal(loss[i], all_loss[c]), (cids, c)
    finally:
        torch.set_num_threads(before)


def test_dense_chain_gradients_equal_vmaps_and_other_models_keep_vmap():
    """DenseChain (batched matrix products, one backward pass) gives vmap(grad)'s per-client gradients and
    losses; a model that is not an nn.Sequential of dense layers (a convolution, a custom forward, a
    Linear that sees [B, T, features]) keeps the vmap path."""
    torch.manual_seed(4)
    module = nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(12, 9), nn.GELU()), nn.Linear(9, 7, bias=False),
                           nn.LeakyReLU(0.2), nn.Identity(), nn.Linear(7, 4))
    flat = FlatModel(module)
    x, y = torch.randn(40, 3, 4), torch.randint(0, 4, (40,))
    group = vectorized.GroupTrainer(flat, config.ClientConfig(), x, y)
    assert group.chain is not None
    names = [n for n, _ in module.named_parameters()]

    def loss(params, xb, yb):
        out = torch.func.functional_call(module, dict(zip(names, params)), (xb,))
        value = torch.nn.functional.cross_entropy(out, yb)
        return value, value.detach()

    weights = flat.vec.unsqueeze(0).repeat(6, 1) + 0.01 * torch.randn(6, flat.n_params)
    params = tuple(group._views(weights))
    idx = torch.randint(0, 40, (6, 5))
    got, got_losses = group.chain.grads(params, x[idx], y[idx])
    want, want_losses = torch.func.vmap(torch.func.grad(loss, has_aux=True))(params, x[idx], y[idx])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-6, atol=1e-7)

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 4)

        def forward(self, xb):
            return self.fc(xb.flatten(1)) * 2

    for other, shape in ((nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 2 * 2, 3)), (1, 4, 4)),
                         (Custom(), (3, 4)), (nn.Sequential(nn.Linear(4, 3)), (3, 4))):
        data = torch.randn(10, *shape)
        assert vectorized.GroupTrainer(FlatModel(other), config.ClientConfig(), data, y[:10]).chain is None


def test_models_that_cannot_vectorize_say_why():
    assert vectorized.unsupported(FlatModel(nn.Sequential(nn.Linear(4, 3)))) is None
    assert "buffers" in vectorized.unsupported(FlatModel(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))))
    assert "dropout" in vectorized.unsupported(FlatModel(nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5))))
    assert "LSTM" in vectorized.unsupported(FlatModel(nn.LSTM(4, 3)))
    assert vectorized.worthwhile(FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(4, 3))))
    assert not vectorized.worthwhile(FlatModel(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())))


# -- whole rounds in one process ------------------------------------------------------------------

SERVER = {"size": 60, "scheme": "iid"}
ALGORITHMS = {
    "fedavg": {},
    "fedavg_momentum_wd_steps": {"client": {"momentum": 0.9, "weight_decay": 0.001, "steps": 6}},
    "fsl": {"algorithm": {"name": "fsl", "gamma": 1.0}, "server_data": SERVER},
    "fednova": {"algorithm": {"name": "fednova"}, "client": {"momentum": 0.5}},
    "datashare": {"algorithm": {"name": "datashare", "alpha": 0.3},
                  "server_data": {"size": 60, "scheme": "iid", "source": "holdout"}},
    "central": {"algorithm": {"name": "central"}},
}


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_vectorized_rounds_equal_the_per_client_loop(name):
    mapping = synthetic(**ALGORITHMS[name])
    loop, batched = run_inprocess(mapping, "off"), run_inprocess(mapping, "on")
    assert loop[0].clients.group_trainer is None and batched[0].clients.group_trainer is not None
    assert_same_training(loop, batched)


def test_uneven_clients_group_by_batch_pattern():
    """mnist5k with a Dirichlet partition: many different sizes, so many groups and singletons; an mlp."""
    mapping = synthetic(data={"name": "mnist5k"}, partition={"clients": 20, "scheme": "dirichlet", "beta": 0.5},
                        model={"name": "mlp", "hidden": 16}, server={"clients_per_round": 12}, rounds=2)
    mapping["partition"] = {"clients": 20, "scheme": "dirichlet", "beta": 0.5}
    loop, batched = run_inprocess(mapping, "off"), run_inprocess(mapping, "on")
    exp = batched[0]
    plan = exp.participation.plan(0)
    standard, selected = plan.standard, plan.selected
    groups, rest = exp.clients._vector_groups(0, [int(c) for c in selected], standard)
    assert not rest and len(groups) > 1
    assert_same_training(loop, batched)
    # auto: 12 of 20 clients of many sizes make no batch pattern of MIN_GROUP clients a round: the whole job
    # trains in the loop, with the loop's bits.
    auto = run_inprocess(mapping, "auto")
    assert auto[0].clients.group_trainer is None
    assert np.array_equal(auto[1].model, loop[1].model)


def test_auto_decides_for_the_whole_job_from_the_config_not_from_a_ranks_share():
    """`auto` batches every client of a job or none, whatever number of them a rank holds (that follows -n):
    5 clients a round train in the loop, 16 of 40 equal clients batched, also in groups under MIN_GROUP and
    alone (a rank's share at larger -n)."""
    small = run_inprocess(synthetic(server={"clients_per_round": 5}, rounds=1), "auto")[0]
    assert small.clients.group_trainer is None
    big = run_inprocess(synthetic(rounds=1), "auto")[0]
    assert big.clients.group_trainer is not None
    plan = big.participation.plan(0)
    selected = [int(c) for c in plan.selected]
    for share in (selected, selected[:3], selected[:1]):
        groups, rest = big.clients._vector_groups(0, share, plan.standard)
        assert rest == [] and sorted(run.cid for runs, _ in groups for run in runs) == sorted(share)
    conv = synthetic(data={"name": "mnist5k"}, partition={"clients": 20, "scheme": "iid"},
                     model={"name": "cnn_mnist"}, rounds=0)
    conv["partition"] = {"clients": 20, "scheme": "iid"}
    assert experiment(config.from_dict(conv), LocalComm()).clients.group_trainer is None


@pytest.mark.parametrize("sizes,per_round,alike", [
    ([200] * 20, 10, True),             # one batch pattern: all 10 of a round
    ([200] * 20, 7, False),             # rounds under MIN_GROUP clients
    ([133, 134] * 15, 10, False),       # 4,000 samples over 30 IID clients: two patterns of ~5 a round
    ([133, 134] * 15, 16, True),        # ~8 of one pattern a round
    ([40] * 3, 10, False),              # 10 a round of 3 clients are 3
    ([], 10, False)])
def test_auto_counts_the_clients_of_one_batch_pattern_in_an_average_round(sizes, per_round, alike):
    assert vectorized.alike_enough(np.array(sizes), config.ClientConfig(batch_size=10), per_round) is alike


@pytest.mark.parametrize("algorithm", ["fedprox", "scaffold", "moon", "fedskip", "safl", "feddyn"])
def test_vectorize_on_refuses_algorithms_with_their_own_client_terms(algorithm):
    mapping = synthetic(algorithm={"name": algorithm}, client={"vectorize": "on"})
    if algorithm == "moon":     # MOON needs a projection head, on images
        mapping.update(data={"name": "mnist5k"}, partition={"clients": 40, "scheme": "iid"},
                       model={"name": "simple_cnn", "projection": 16})
    with pytest.raises(ConfigError, match="client.vectorize = 'on'"):
        experiment(config.from_dict(mapping), LocalComm())
    # auto falls back to the loop for them
    mapping["client"]["vectorize"] = "auto"
    assert experiment(config.from_dict(mapping), LocalComm()).clients.group_trainer is None


# -- end to end --------------------------------------------------------------------------------------

@session_runs.plan
def vectorized_runs(base):
    """The per-client loop at -n 1, vectorized at -n 3 (tests/session_runs.py: in the launches shared with
    other files)."""
    runs, steps = {}, {}
    for n, mode in [(1, "off"), (3, "on")]:
        out = base / f"n{n}-{mode}"
        cfg = synthetic(out, client={"vectorize": mode}, server={"clients_per_round": 20}, rounds=3)
        steps[n] = [["run", write_config(base / f"n{n}-{mode}.yaml", cfg)]]
        runs[n, mode] = out
    return steps, runs


@pytest.fixture(scope="module")
def vectorized_mpi_runs(request):
    return session_runs.result(request, vectorized_runs)


@pytest.mark.mpi
def test_vectorized_run_at_three_ranks_equals_the_loop_at_one(vectorized_mpi_runs):
    runs = vectorized_mpi_runs
    (m1, _), (m3, _) = read_metrics(runs[1, "off"]), read_metrics(runs[3, "on"])
    np.testing.assert_array_equal(m3["test_acc"], m1["test_acc"])
    np.testing.assert_allclose(m3["train_loss"], m1["train_loss"], rtol=RTOL)
    np.testing.assert_allclose(read_global(runs[3, "on"]), read_global(runs[1, "off"]), rtol=RTOL, atol=ATOL)


# Every `auto` left at auto (client.vectorize, runtime.kernels, runtime.client_dealing, server.trains_clients)
# at -n 1, 2 and 3, threads fixed (issue 38): the same bits. At -n 1 a rank holds all 10 clients of a round, at
# -n 3 about 5, and `auto` once batched only groups of MIN_GROUP clients on one rank: the median case then
# differed by 2e-3 (a median picks one client's value, so rounding-level differences pick another client),
# FedAvg by 4e-8. The quickstart's cnn_mnist runs the fast CPU kernels (`runtime.kernels: auto`).
def _mlp_case(out, **server):
    return {"seed": 0, "rounds": 4, "out": str(out), "data": {"name": "mnist5k"},
            "partition": {"clients": 20, "scheme": "iid"}, "model": {"name": "mlp"},
            "client": {"lr": 0.05, "batch_size": 10, "epochs": 1}, "server": {"clients_per_round": 10, **server},
            "algorithm": {"name": "fedavg"}, "eval": {"every": 1}, "runtime": {"threads": 1, "progress": "lines"}}


AUTO_CASES = {
    "median": lambda out: _mlp_case(out, aggregator="median"),
    "fedavg": lambda out: _mlp_case(out),
    "quickstart": lambda out: {**yaml.safe_load((ROOT / "jobs/configs/quickstart.yaml").read_text()), "rounds": 2,
                               "out": str(out), "runtime": {"threads": 1, "progress": "lines"}},
}


def _auto_runs(base, n):
    steps = [[write_config(base / f"{name}.yaml", case(base / name))] for name, case in AUTO_CASES.items()]
    return steps, base


auto_runs = session_runs.per_n(_auto_runs, ns=(1, 2, 3))


@pytest.fixture(scope="module")
def auto_mpi_runs(request):
    return session_runs.result(request, auto_runs)


@pytest.mark.mpi
@pytest.mark.parametrize("case", list(AUTO_CASES))
def test_every_auto_gives_the_same_model_at_every_rank_count(auto_mpi_runs, case):
    (ref, attrs) = read_metrics(auto_mpi_runs[1] / case)
    assert attrs["status"] == "finished"
    for n in (2, 3):
        metrics, attrs = read_metrics(auto_mpi_runs[n] / case)
        assert attrs["world_size"] == n
        for key in ("model_sha256", "test_acc", "test_loss", "train_loss", "uploads"):
            assert np.array_equal(metrics[key], ref[key]), (case, n, key)
        assert np.array_equal(read_global(auto_mpi_runs[n] / case), read_global(auto_mpi_runs[1] / case)), (case, n)
