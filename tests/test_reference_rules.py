"""Issue 38: the four rules where fedmpi's arithmetic differed from the reference code run side by side, each
now an option whose default follows the reference (docs/explanation/baselines.md). Every test writes the reference's
rule out here, in the reference's order of operations, on small seeded inputs, and holds fedmpi's default to
it; the other option value reproduces fedmpi's earlier rule; small cases are worked by hand.

- min-sum (Shejwalkar and Houmansadr, NDSS'21, vrt1shjwlkr/NDSS21-Model-Poisoning, `our_attack_score`):
  the bound is the smallest benign sum of squared distances (`attack.sum_bound: min`); `max` was fedmpi's.
- Bulyan (Flower, `aggregate_bulyan` over `aggregate_krum`): Krum scores over max(1, n - f - 2) closest
  others (`server.robust.min_neighbours: 1`); 0 was fedmpi's.
- Per-FedAvg (PFLlib, `serverperavg.py` calling `clientPerAvg.train` twice per round): one meta-step per batch
  of 2B split in halves, per call; fedmpi's default `algorithm.meta_steps: steps` is that round (issue 52),
  `pairs` one call, half of it.
- IFCA (jichan3751/ifca): each cluster the sample-weighted mean of its clients' models (femnist's
  `update_model`), fedmpi's default; the unweighted mean of the mnist and cifar scripts is
  `server.weighting: uniform`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import VecModel, server_update

from fedmpi import config
from fedmpi.algorithms import ClientRun, build_algorithm
from fedmpi.algorithms.perfedavg import MetaSteps, meta_batches
from fedmpi.attacks.keys import AttackConfig
from fedmpi.attacks.omniscient import OmniscientAttack
from fedmpi.core.flat import FlatModel
from fedmpi.core.train import LocalTrainer, Schedule, batch_order, steps_per_epoch
from fedmpi.robust import aggregators as agg
from fedmpi.robust.driver import aggregate_chunks
from fedmpi.robust.keys import RobustConfig
from fedmpi.robust.rules import build_rule

SEED = 11


# -- min-sum ----------------------------------------------------------------------------------------------

def min_sum_search(benign, deviation, bound):
    """The authors' min-sum search (float64): the benign mean minus lamda times the deviation, lamda from 10
    by halving steps to 1e-5, accepted while the sum of squared distances to the benign updates is at most
    the bound's benign sum ('min' as their code; 'max' fedmpi's earlier rule). Returns (lamda, update)."""
    mu = benign.mean(axis=0)
    pairwise = ((benign[:, None, :] - benign[None, :, :]) ** 2).sum(axis=2)
    scores = pairwise.sum(axis=1)
    limit = scores.min() if bound == "min" else scores.max()
    lamda, fail, succ = 10.0, 10.0, 0.0
    while abs(succ - lamda) > 1e-5:
        score = ((benign - (mu - lamda * deviation)) ** 2).sum()
        if score <= limit:
            succ, lamda = lamda, lamda + fail / 2
        else:
            lamda = lamda - fail / 2
        fail /= 2
    return succ, mu - succ * deviation


def craft_min_sum(rows, malicious, **keys):
    rows = np.asarray(rows, dtype=np.float32).copy()
    attack = OmniscientAttack(AttackConfig(name="min_sum", **keys), np.asarray(malicious, dtype=bool), 4)
    attack.prepare(lambda visit: visit(0, rows.shape[1], rows))
    attack.craft(0, rows.shape[1], rows)
    return rows, attack


@pytest.mark.parametrize("perturbation", ["std", "unit", "sign"])
@pytest.mark.parametrize("bound", ["min", "max"])
def test_min_sum_is_the_authors_search_and_max_is_fedmpis_earlier_rule(perturbation, bound):
    g = np.random.default_rng(SEED)
    benign = g.normal(size=(6, 13)).astype(np.float32)
    rows = np.vstack([benign, np.zeros((2, 13), np.float32)])
    b = benign.astype(np.float64)
    mu = b.mean(axis=0)
    deviation = {"std": b.std(axis=0, ddof=1), "unit": mu / np.linalg.norm(mu), "sign": np.sign(mu)}[perturbation]
    gamma_ref, update_ref = min_sum_search(b, deviation, bound)
    keys = {"perturbation": perturbation, **({} if bound == "min" else {"sum_bound": "max"})}
    out, attack = craft_min_sum(rows, [0] * 6 + [1, 1], **keys)
    assert 0 < gamma_ref < 10       # inside the search's reach: it then meets the exact root to its 1e-5 step
    assert attack.gamma == pytest.approx(gamma_ref, abs=2e-5)
    np.testing.assert_allclose(out[6], update_ref, atol=1e-4 * max(1.0, np.abs(deviation).max()))


def test_min_sum_bounds_by_hand():
    # Benign 0, 1, 5: mu 2, sigma sqrt(7). sum_i (m - b_i)^2 = 3 (m - 2)^2 + 14 and row j's sum is
    # 3 (b_j - 2)^2 + 14, so the malicious update may lie as far from mu as the benign row nearest mu (1,
    # distance 1: gamma = 1/sqrt 7, m = 1) under min, as the farthest (5, distance 3: m = -1) under max.
    rows = [[0.0], [1.0], [5.0], [9.0]]
    out, attack = craft_min_sum(rows, [0, 0, 0, 1])
    assert attack.gamma == pytest.approx(1 / math.sqrt(7)) and out[3, 0] == pytest.approx(1.0, abs=1e-6)
    out, attack = craft_min_sum(rows, [0, 0, 0, 1], sum_bound="max")
    assert attack.gamma == pytest.approx(3 / math.sqrt(7)) and out[3, 0] == pytest.approx(-1.0, abs=1e-6)


# -- Bulyan -----------------------------------------------------------------------------------------------

def flower_bulyan(rows, f):
    """Flower's aggregate_bulyan with aggregate_krum (float64): theta = n - 2f times, Krum over the models
    left, each scored by the squared distances to its max(1, n - f - 2) closest others (argsort of its row
    without the first entry, itself), the argmin taken and removed; then per coordinate the mean of the
    beta = theta - 2f selected values closest to the selected models' median."""
    left = [np.asarray(r, dtype=np.float64) for r in rows]
    chosen = []
    for _ in range(len(rows) - 2 * f):
        dist = np.array([[np.linalg.norm(a - b) ** 2 for b in left] for a in left])
        k = max(1, len(left) - f - 2)
        scores = [dist[i, np.argsort(dist[i])[1:k + 1]].sum() for i in range(len(left))]
        chosen.append(left.pop(int(np.argmin(scores))))
    selected = np.array(chosen)
    beta = len(chosen) - 2 * f
    median = np.median(selected, axis=0)
    closest = np.argpartition(np.abs(median - selected), kth=beta - 1, axis=0)
    return np.take_along_axis(selected, closest, axis=0)[:beta].mean(axis=0)


def bulyan(rows, **keys):
    rows = np.asarray(rows, dtype=np.float32)
    n, d = rows.shape
    return aggregate_chunks(build_rule("bulyan", RobustConfig(**keys)), lambda lo, hi: rows[:, lo:hi].copy(),
                            np.ones(n), d, max(4, d), block=4)


@pytest.mark.parametrize("n, f", [(7, 1), (8, 1), (11, 2)])
@pytest.mark.parametrize("seed", range(4))
def test_bulyan_is_flowers(n, f, seed):
    rows = np.random.default_rng(seed).normal(size=(n, 9)).astype(np.float32)
    np.testing.assert_allclose(bulyan(rows, f=f).update, flower_bulyan(rows, f), rtol=1e-6, atol=1e-7)


def old_bulyan_select(dist, f, theta):
    """fedmpi's earlier selection: Krum over max(0, n - f - 2) closest others, equal scores to the lower row."""
    left, chosen = list(range(len(dist))), []
    while len(chosen) < theta:
        k = max(len(left) - f - 2, 0)
        scores = [np.sort([dist[i, j] for j in left if j != i])[:k].sum() for i in left]
        chosen.append(left.pop(int(np.argmin(scores))))
    return sorted(chosen)


@pytest.mark.parametrize("seed", range(6))
def test_bulyan_min_neighbours_0_is_fedmpis_earlier_selection(seed):
    rows = np.random.default_rng(seed).normal(size=(7, 9)).astype(np.float32)
    dist = agg.sq_distances(agg.gram(rows))
    keep = old_bulyan_select(dist, 1, 5)
    assert agg.bulyan_select(dist, 1, 5, least=0).tolist() == keep
    out = bulyan(rows, f=1, min_neighbours=0)
    values, _ = agg.bulyan_coordinates(rows[keep], 1)
    np.testing.assert_allclose(out.update, values, rtol=1e-12)


def test_bulyan_last_pick_by_hand():
    # n = 7, f = 1, theta = 5. Krum picks 3, then 2, then 1 (tie with 20, lower id), then 20 (tie with 21);
    # left are 100 (id 0), 0 and 21, where n - f - 2 = 0: every score is 0 and the lowest id, the outlier
    # 100, was chosen; with one neighbour each scores 79^2, 21^2, 21^2 and 0 (id 1) is chosen.
    points = np.array([[100], [0], [1], [2], [3], [20], [21]], dtype=np.float64)
    dist = agg.sq_distances(agg.gram(points))
    assert agg.bulyan_select(dist, 1, 5).tolist() == [1, 2, 3, 4, 5]
    assert agg.bulyan_select(dist, 1, 5, least=0).tolist() == [0, 2, 3, 4, 5]
    # either way the beta = 3 values nearest the median (2) are 1, 2, 3: the outlier is chosen but not used
    for least in (0, 1):
        out = bulyan(points, f=1, min_neighbours=least)
        assert out.update.tolist() == [2.0] and out.weights.tolist() == pytest.approx([0, 0, 1 / 3, 1 / 3, 1 / 3, 0, 0])


# -- Per-FedAvg -------------------------------------------------------------------------------------------

def tiny():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def pfllib_perfedavg(model, x, y, double_batches, b, alpha, beta):
    """PFLlib's clientPerAvg.train on the given batches of 2B: per batch, keep the parameters, an SGD step at
    alpha on the first B samples, the gradient on the last B at the stepped model, the kept parameters put
    back and the step taken at beta (PerAvgOptimizer.step(beta))."""
    for positions in double_batches:
        kept = [p.detach().clone() for p in model.parameters()]
        first, second = positions[:b], positions[b:]
        model.zero_grad()
        F.cross_entropy(model(x[first]), y[first]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-alpha)
        model.zero_grad()
        F.cross_entropy(model(x[second]), y[second]).backward()
        with torch.no_grad():
            for p, k in zip(model.parameters(), kept):
                p.copy_(k)
                p.add_(p.grad, alpha=-beta)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("alpha, beta", [(0.05, 0.05), (0.02, 0.1)])
def test_perfedavg_meta_steps_are_pfllibs_on_the_same_batches(alpha, beta):
    n, b, epochs = 24, 4, 2                     # 2B divides n: PFLlib's 3 meta-steps per epoch, 6 in all
    g = torch.Generator().manual_seed(SEED)
    x, y = torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)
    steps = epochs * steps_per_epoch(n, b)
    sched = Schedule(b, meta_batches(steps, "pairs"))         # one clientPerAvg.train() call
    order = batch_order(np.random.default_rng(SEED), n, sched)
    doubles = [torch.from_numpy(np.concatenate(order[i:i + 2])) for i in range(0, len(order), 2)]
    assert len(doubles) == epochs * (n // (2 * b))
    ref = pfllib_perfedavg(tiny(), x, y, doubles, b, alpha, beta)
    flat = FlatModel(tiny())
    cfg = config.from_dict({"client": {"lr": alpha, "batch_size": b}}).client
    LocalTrainer(flat, cfg, x, y).train(torch.arange(n), np.random.default_rng(SEED), sched, lr=alpha,
                                        grad_hook=MetaSteps(alpha, beta))
    torch.testing.assert_close(flat.vec, ref, rtol=1e-5, atol=1e-6)


def test_perfedavg_meta_step_counts_against_pfllibs():
    # PFLlib: floor(n / 2B) per epoch (a DataLoader of 2B with drop_last). fedmpi pairs the round's batches:
    # the same count where 2B divides n, or with client.drop_last over one epoch of at least 2B; otherwise the
    # short or odd batch is used too (30 samples, B = 4: 4 meta-steps against 3; B = 10, 2 epochs: 3 against 2).
    def pfllib(n, b, e):
        return e * (n // (2 * b))

    def fedmpi(n, b, e, drop_last=False):
        return meta_batches(e * steps_per_epoch(n, b, drop_last), "pairs") // 2

    for n in range(8, 60):
        for b in (2, 3, 4, 5):
            if n % (2 * b) == 0:
                assert all(fedmpi(n, b, e) == pfllib(n, b, e) for e in (1, 2, 3))
            if n >= 2 * b:       # below, PFLlib trains on no batch and fedmpi on at least one meta-step
                assert fedmpi(n, b, 1, drop_last=True) == pfllib(n, b, 1)
    assert (fedmpi(30, 4, 1), pfllib(30, 4, 1)) == (4, 3) and (fedmpi(30, 10, 2), pfllib(30, 10, 2)) == (3, 2)
    # PFLlib's round is two train() calls: the default's count, where 2B divides n
    assert all(meta_batches(e * steps_per_epoch(n, b)) // 2 == 2 * pfllib(n, b, e)
               for n in range(8, 60) for b in (2, 3, 4, 5) for e in (1, 2, 3) if n % (2 * b) == 0)


def pfllib_round_against_fedmpi(meta_steps, rounds=3, n=24, b=4, epochs=1, alpha=0.05, beta=0.05):
    """(fedmpi's model, PFLlib's) after `rounds` rounds of one client from the same start, on the same batches:
    PFLlib's round is serverperavg.py's two clientPerAvg.train() calls (each `epochs` epochs of batches of 2B);
    fedmpi's pass runs `meta_steps`' batches of B from the round's schedule, which the reference takes pairwise."""
    g = torch.Generator().manual_seed(SEED)
    x, y = torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)
    ref, flat = tiny(), FlatModel(tiny())
    cfg = config.from_dict({"client": {"lr": alpha, "batch_size": b}}).client
    per_call = epochs * (n // (2 * b))
    for r in range(rounds):
        full = Schedule(b, meta_batches(epochs * steps_per_epoch(n, b), "steps"))     # the two calls' batches
        order = batch_order(np.random.default_rng(SEED + r), n, full)
        doubles = [torch.from_numpy(np.concatenate(order[i:i + 2])) for i in range(0, len(order), 2)]
        assert len(doubles) == 2 * per_call
        for call in (doubles[:per_call], doubles[per_call:]):           # client.train(); client.train()
            pfllib_perfedavg(ref, x, y, call, b, alpha, beta)
        sched = Schedule(b, meta_batches(epochs * steps_per_epoch(n, b), meta_steps))
        LocalTrainer(flat, cfg, x, y).train(torch.arange(n), np.random.default_rng(SEED + r), sched, lr=alpha,
                                            grad_hook=MetaSteps(alpha, beta))
    return flat.vec, torch.cat([p.detach().reshape(-1) for p in ref.parameters()])


def test_perfedavg_default_round_is_pfllibs_round_of_two_train_calls():
    from fedmpi.algorithms.perfedavg import PerFedAvgKeys

    assert PerFedAvgKeys().meta_steps == "steps"
    ours, ref = pfllib_round_against_fedmpi(PerFedAvgKeys().meta_steps)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    half, ref = pfllib_round_against_fedmpi("pairs")        # one train() call a round: half PFLlib's round
    assert float((half - ref).abs().max()) > 1e-2


def test_perfedavg_meta_steps_steps_runs_one_meta_step_per_scheduled_step():
    assert [meta_batches(s, "steps") for s in (1, 2, 5)] == [2, 4, 10]
    cfg = config.from_dict({"algorithm": {"name": "perfedavg", "alpha": 0.1, "beta": 0.2, "meta_steps": "steps"},
                            "client": {"lr": 0.1}})
    algo = build_algorithm(cfg, 1, 1)
    model = VecModel(1)
    model.load(torch.tensor([1.0]))

    class Quadratic:            # f = 1/2 theta^2; records the pass's step count
        steps, passes = 3, []

        def train(self, steps, lr, grad_hook):
            self.passes.append(steps)
            p = model.vec
            for _ in range(steps):
                grad = p.clone()
                grad_hook(p, grad)
                p.sub_(grad, alpha=lr)
            return torch.tensor(0.0), steps

    local = Quadratic()
    algo.local_training(ClientRun(0, 0, 10, lr=0.1), torch.tensor([1.0]), model, local)
    assert local.passes == [6]            # 3 meta-steps, theta <- theta - 0.2 (0.9 theta) each: 0.82^3
    assert float(model.vec[0]) == pytest.approx(0.82 ** 3, rel=1e-6)


# -- IFCA -------------------------------------------------------------------------------------------------

def ifca_reference(models, samples, weighted):
    """The authors' cluster update for one cluster's clients: femnist's update_model, sum_i n_i w_i / sum_i
    n_i in float64; the mnist and cifar scripts' plain mean of the models (weighted False)."""
    models = [np.asarray(m, dtype=np.float64) for m in models]
    if not weighted:
        return sum(models) / len(models)
    return sum(n * m for n, m in zip(samples, models)) / sum(samples)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_ifca_cluster_models_are_the_authors_means(weighting):
    g = np.random.default_rng(SEED)
    dim, k = 5, 2
    cfg = config.from_dict({"algorithm": {"name": "ifca", "k": k}, "server": {"weighting": weighting}})
    algo = build_algorithm(cfg, dim, dim)
    start = [torch.tensor(g.normal(size=dim), dtype=torch.float32) for _ in range(k)]
    algo.server.get("clusters", "cpu").copy_(start[1])
    down = torch.cat(start)
    samples, cluster = [3, 10, 7, 1, 6], [0, 1, 0, 1, 1]
    trained = [start[j] + torch.tensor(g.normal(size=dim), dtype=torch.float32) for j in cluster]
    acc, total = torch.zeros(k * dim + k, dtype=torch.float64), 0.0
    for cid, (n, j, w) in enumerate(zip(samples, cluster, trained)):
        run = ClientRun(cid, 0, n, lr=0.1, weight=1.0 if weighting == "uniform" else None)   # as Clients.new_run
        algo._slot[cid] = j
        model = VecModel(dim)
        model.load(w)
        total += algo.accumulate(run, down, model, acc)
    new_x = server_update(algo, start[0], acc, total)
    for j, got in enumerate([new_x, algo.server.get("clusters", "cpu")]):
        mine = [i for i, c in enumerate(cluster) if c == j]
        want = ifca_reference([trained[i].numpy() for i in mine], [samples[i] for i in mine], weighting == "samples")
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
