"""The federated LoRA rules (fedit, ffa_lora, fedsa_lora, hetlora, flora; issue 54) through their hooks, in
process, on the LoRA plug-in model of tests/lora_nets.py: hand-computed aggregates, FLoRA against a port of the
reference's stacking, the product-gap figure, and the refusals (exit 2) of what a rule cannot run."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("peft")

import torch  # noqa: E402
from lora_nets import Plain, TinyLora  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.algorithms import build_algorithm, lookup, personal_split, prepare_model  # noqa: E402
from fedmpi.algorithms.base import ClientRun, SetupContext  # noqa: E402
from fedmpi.algorithms.lora import adapter_layout  # noqa: E402
from fedmpi.core.errors import ConfigError  # noqa: E402
from fedmpi.core.flat import FlatModel  # noqa: E402

LORA_MODEL = "lora_nets:TinyLora"


def cfg_of(name, clients=3, model=LORA_MODEL, **keys):
    extra = keys.pop("cfg", {})
    return config.from_dict({"algorithm": {"name": name, **keys}, "model": {"name": model},
                             "partition": {"clients": clients},
                             "server": {"clients_per_round": clients, **extra.get("server", {})}})


def built(cfg, input_shape=(4,), classes=3, width=5, rank=4, seed=0):
    """(FlatModel, algorithm) of `cfg` on the plug-in model, prepared and set up as a run does."""
    torch.manual_seed(seed)
    module = (TinyLora(input_shape, classes, width=width, rank=rank) if cfg.model.name == LORA_MODEL
              else Plain(input_shape, classes, width=width))
    flat = FlatModel(prepare_model(cfg, module))
    algo = build_algorithm(cfg, flat.dim, flat.n_params, split=personal_split(cfg, flat))
    algo.setup(SetupContext(np.ones(cfg.partition.clients), np.zeros(0, dtype=np.int64), flat.vec.clone(),
                            model=flat))
    return flat, algo


def upload(algo, flat, down, cid, adapters, weight=1.0):
    """One client's upload of `adapters` ({layer index: (A, B)}) from `down`, through client_start and
    accumulate; returns the accumulator and the weight."""
    run = ClientRun(cid=cid, round=0, n_samples=int(weight), lr=0.1)
    algo.client_start(run, down, flat)
    for pair, (a, b) in zip(algo.layout if hasattr(algo, "layout") else adapter_layout(flat), adapters):
        if a is not None and pair.a is not None:
            pair.A(flat.vec.detach()).copy_(a)
        pair.B(flat.vec.detach()).copy_(b)
    acc = torch.zeros(algo.dim, dtype=torch.float64)
    w = algo.accumulate(run, down, flat, acc)
    return acc, w


def random_adapters(layout, gen, rank=None):
    out = []
    for pair in layout:
        r = pair.rank if rank is None else rank
        a = torch.zeros(pair.rank, pair.d_in)
        b = torch.zeros(pair.d_out, pair.rank)
        a[:r] = torch.randn(r, pair.d_in, generator=gen)
        b[:, :r] = torch.randn(pair.d_out, r, generator=gen)
        out.append((a, b))
    return out


# -- FedIT --------------------------------------------------------------------------------------------------
def reference_fedit(state_dicts, sizes):
    """JayZhang42/FederatedGPT-Shepherd, fed_utils/model_aggregation.py, FedAvg (commit 90d8aa6): the clients'
    adapter state dicts summed with the weights normalize(sizes, p=1), key by key."""
    weights_array = torch.nn.functional.normalize(torch.tensor(sizes, dtype=torch.float32), p=1, dim=0)
    out = {key: state_dicts[0][key] * weights_array[0] for key in state_dicts[0]}
    for k in range(1, len(state_dicts)):
        out = {key: out[key] + state_dicts[k][key] * weights_array[k] for key in state_dicts[k]}
    return out


def test_fedit_averages_a_and_b_as_the_reference_does():
    flat, algo = built(cfg_of("fedit"))
    layout, gen = adapter_layout(flat), torch.Generator().manual_seed(6)
    down = flat.vec.clone()
    sizes = [5.0, 2.0, 9.0]
    ups = [random_adapters(layout, gen) for _ in sizes]
    total = torch.zeros(algo.dim, dtype=torch.float64)
    for cid, (ad, n) in enumerate(zip(ups, sizes)):
        total += upload(algo, flat, down, cid, ad, weight=n)[0]
    new = down.double() + algo.aggregate(down, total, sum(sizes), 0)
    reference = reference_fedit([{f"{p.name}.{m}": t for p, (a, b) in zip(layout, ad) for m, t in (("A", a), ("B", b))}
                                 for ad in ups], sizes)
    for pair in layout:
        assert torch.allclose(pair.A(new), reference[f"{pair.name}.A"].double(), atol=1e-6)
        assert torch.allclose(pair.B(new), reference[f"{pair.name}.B"].double(), atol=1e-6)


# -- FFA-LoRA ------------------------------------------------------------------------------------------------
def test_ffa_lora_freezes_a_out_of_the_vector_and_its_mean_of_products_is_exact():
    cfg = cfg_of("ffa_lora")
    flat, algo = built(cfg)
    names = [name for name, _, _ in flat.entries]
    assert names and all("lora_B" in n for n in names), names      # only B travels
    layout = adapter_layout(flat)
    assert all(p.a is None for p in layout)
    # Hand-computed, layer fc1 (d_out 5, r 4, d_in 4): A fixed; two clients' B of weights 1 and 3.
    a = next(iter(dict(flat.module.named_modules())[layout[0].name].lora_A.values())).weight.detach()
    b1, b2 = torch.full((5, 4), 1.0), torch.full((5, 4), 3.0)
    down = flat.vec.clone()
    acc1, w1 = upload(algo, flat, down, 0, [(None, b1), (None, torch.zeros(3, 4))], weight=1)
    acc2, w2 = upload(algo, flat, down, 1, [(None, b2), (None, torch.zeros(3, 4))], weight=3)
    mean = algo.aggregate(down, acc1 + acc2, w1 + w2, 0)
    b_mean = layout[0].B(down.double() + mean)
    assert torch.equal(b_mean, torch.full((5, 4), 2.5, dtype=torch.float64))     # (1 * 1 + 3 * 3) / 4
    s = layout[0].scaling
    mean_of_products = (1 * s * (b1.double() @ a.double()) + 3 * s * (b2.double() @ a.double())) / 4
    assert torch.allclose(s * b_mean @ a.double(), mean_of_products, rtol=0, atol=1e-12)


# -- FedSA-LoRA ----------------------------------------------------------------------------------------------
def test_fedsa_lora_keeps_b_personal_and_shares_a():
    cfg = cfg_of("fedsa_lora")
    flat, algo = built(cfg)
    assert algo.split is not None
    personal = {name for name, _, _ in flat.entries if "lora_B" in name}
    n_b = sum(numel for name, _, numel in flat.entries if name in personal)
    assert algo.split.personal_dim == n_b and algo.split.shared_dim == flat.dim - n_b


# -- HetLoRA -------------------------------------------------------------------------------------------------
def test_hetlora_truncates_masks_and_zero_pads_with_sparsity_weights():
    cfg = cfg_of("hetlora", ranks=[2, 4])          # client 0: rank 2, client 1: rank 4 (cycle)
    flat, algo = built(cfg)
    layout = algo.layout
    gen = torch.Generator().manual_seed(1)
    down = flat.vec.clone()
    for pair in layout:                             # a global model with every adapter entry non-zero
        pair.B(down).copy_(torch.randn(pair.d_out, pair.rank, generator=gen))
    # client_start truncates to the client's rank; the gradient mask keeps it there.
    run = ClientRun(cid=0, round=0, n_samples=1, lr=0.1)
    algo.client_start(run, down, flat)
    for pair in layout:
        assert not pair.A(flat.vec).detach()[2:].any() and not pair.B(flat.vec).detach()[:, 2:].any()
        assert pair.A(flat.vec).detach()[:2].equal(pair.A(down)[:2])
    grad = torch.ones(flat.n_params)
    algo.grad_hook(flat.params, grad)
    assert not layout[0].A(grad)[2:].any() and layout[0].A(grad)[:2].eq(1).all()
    # Uploads: client 0 at rank 2, client 1 at rank 4; weights ||s B A||_F over both layers.
    ups = [random_adapters(layout, gen, rank=2), random_adapters(layout, gen)]
    accs, weights = zip(*(upload(algo, flat, down, cid, ad) for cid, ad in enumerate(ups)))
    norms = [math.sqrt(sum(float(((p.scaling * b.double() @ a.double()) ** 2).sum()) for p, (a, b) in
                           zip(layout, ad))) for ad in ups]
    assert weights == pytest.approx(norms, rel=1e-6)
    mean = algo.aggregate(down, accs[0] + accs[1], sum(weights), 0)
    for i, pair in enumerate(layout):
        padded = (weights[0] * ups[0][i][0].double() + weights[1] * ups[1][i][0].double()) / sum(weights)
        assert torch.allclose(pair.A(down.double() + mean), padded, atol=1e-6)
        rows = pair.A(down.double() + mean)[2:]     # only the rank-4 client's rows, scaled by its share
        assert torch.allclose(rows, ups[1][i][0][2:].double() * weights[1] / sum(weights), atol=1e-6)


def test_hetlora_client_ranks_cycle_and_draw_the_same_everywhere():
    _, cycle = built(cfg_of("hetlora", clients=5, ranks=[1, 2, 4]))
    assert [cycle.rank_of(c) for c in range(5)] == [1, 2, 4, 1, 2]
    _, draw = built(cfg_of("hetlora", clients=5, ranks=[1, 2, 4], rank_assignment="draw"))
    _, again = built(cfg_of("hetlora", clients=5, ranks=[1, 2, 4], rank_assignment="draw"))
    drawn = [draw.rank_of(c) for c in range(40)]
    assert drawn == [again.rank_of(c) for c in range(40)] and set(drawn) == {1, 2, 4}


def test_hetlora_self_pruning_regularises_the_tail_and_prunes_when_its_norm_falls():
    # rank 4, gamma 0.5: the tail is ranks 2 and 3; a prune leaves rank 2.
    cfg = cfg_of("hetlora", clients=2, ranks=[4], prune_lambda=0.25, prune_decay=0.5, aggregation="mean")
    flat, algo = built(cfg)
    layout, gen = algo.layout, torch.Generator().manual_seed(4)
    down = flat.vec.clone()
    ups = random_adapters(layout, gen)

    def tail_norm(adapters, scale=1.0):
        return math.sqrt(sum(float(((p.scaling * (scale * b[:, 2:]).double() @ a[2:].double()) ** 2).sum())
                             for p, (a, b) in zip(layout, adapters)))

    # The loss: cross-entropy plus lambda times the tail's product norm, at the client's trained values.
    run = ClientRun(cid=0, round=0, n_samples=1, lr=0.1)
    algo.client_start(run, down, flat)
    for pair, (a, b) in zip(layout, ups):
        pair.A(flat.vec.detach()).copy_(a)
        pair.B(flat.vec.detach()).copy_(b)
    xb, yb = torch.randn(3, 4, generator=gen), torch.tensor([0, 2, 1])
    plain = float(torch.nn.functional.cross_entropy(flat.module(xb), yb).detach())
    assert float(algo.loss_fn(xb, yb).detach()) == pytest.approx(plain + 0.25 * tail_norm(ups), rel=1e-5)
    # Round 0: nothing to compare with, the rank stays 4 and the norm is kept.
    upload(algo, flat, down, 0, ups)
    assert algo.rank_of(0) == 4 and float(algo.tail_norms.on(0, "cpu")[0]) == pytest.approx(tail_norm(ups), 1e-5)
    # A larger tail next round: no prune.
    bigger = [(a, 2 * b) for a, b in ups]
    upload(algo, flat, down, 0, bigger)
    assert algo.rank_of(0) == 4
    # A smaller one: prune to floor(0.5 * 4) = 2, the upload's tail already zero, and rank 2 from then on.
    smaller = [(a, 0.5 * b) for a, b in ups]
    acc, _ = upload(algo, flat, down, 0, smaller)
    assert algo.rank_of(0) == 2
    for pair in layout:
        assert torch.equal(pair.A(acc)[2:], -pair.A(down.double())[2:])     # zero minus the broadcast
        assert torch.equal(pair.B(acc)[:, 2:], -pair.B(down.double())[:, 2:])
    run = ClientRun(cid=0, round=3, n_samples=1, lr=0.1)
    algo.client_start(run, down, flat)
    assert not layout[0].A(flat.vec.detach())[2:].any()
    assert algo.rank_of(1) == 4          # the other client's rank is its own


# -- FLoRA ---------------------------------------------------------------------------------------------------
def reference_stacking(adapters, weights):
    """ATP-1010/FederatedLLM, fed_utils/model_aggregation.py, FedAvg(..., stacking=True, heter, zero_padding=
    False), lines 58-91 (commit 0912cd3): weights normalised with p=1; client 0's A times its weight, B as is;
    each further client's A (shape[0] == its rank) times its weight concatenated along dim 0, its B
    (shape[1] == its rank) concatenated along dim 1. `adapters`: per client (A [r_k, d_in], B [d_out, r_k])."""
    weights_array = torch.nn.functional.normalize(torch.tensor(weights, dtype=torch.float32), p=1, dim=0)
    stacked_a = stacked_b = None
    for k, (a, b) in enumerate(adapters):
        if k == 0:
            stacked_a, stacked_b = a * weights_array[k], b
        else:
            stacked_a = torch.cat([stacked_a, a * weights_array[k]], dim=0)
            stacked_b = torch.cat([stacked_b, b], dim=1)
    return stacked_a, stacked_b


def test_flora_merges_the_stacked_product_of_the_reference():
    cfg = cfg_of("flora", clients=3, ranks=[2, 4, 3])
    flat, algo = built(cfg)
    layout = algo.layout
    assert all(p.delta is not None for p in layout)
    gen = torch.Generator().manual_seed(5)
    down = flat.vec.clone()
    ranks, weights = [2, 4, 3], [3.0, 1.0, 5.0]
    ups = [random_adapters(layout, gen, rank=r) for r in ranks]
    total, wsum = torch.zeros(algo.dim, dtype=torch.float64), 0.0
    for cid, (ad, w) in enumerate(zip(ups, weights)):
        acc, got = upload(algo, flat, down, cid, ad, weight=w)
        total += acc
        wsum += got
    mean = algo.aggregate(down, total, wsum, 0)
    for i, pair in enumerate(layout):
        stacked_a, stacked_b = reference_stacking([(ad[i][0][:r], ad[i][1][:, :r]) for ad, r in zip(ups, ranks)],
                                                  weights)
        reference = pair.scaling * (stacked_b.double() @ stacked_a.double())
        assert torch.allclose(pair.D(mean), reference, rtol=1e-5, atol=1e-6)
        assert not pair.A(mean).any() and not pair.B(mean).any()    # adapters restart, never averaged in
    # after_step: fresh adapters, A from the round's seeded draw (the same for the same round), B zero.
    x = down.clone() + mean.float()
    x = algo.after_step(x, 0)
    again = algo.after_step(x.clone(), 0)
    assert torch.equal(x, again)
    assert all(not p.B(x).any() and p.A(x).abs().max() <= 1 / math.sqrt(p.d_in) for p in layout)
    assert not torch.equal(layout[0].A(x), layout[0].A(algo.after_step(x.clone(), 1)))


def test_flora_forward_adds_the_merged_delta():
    flat, algo = built(cfg_of("flora"))
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    before = flat.module(x).detach()
    pair = algo.layout[-1]                  # fc2: the output layer, delta adds delta @ h
    pair.D(flat.vec.detach()).fill_(0.5)
    h = flat.module.base_model.model.fc1(x).relu()
    assert torch.allclose(flat.module(x).detach(), before + h @ torch.full((3, 5), 0.5).T, atol=1e-6)


def one_by_one_model_uploads(name, products, **keys):
    """The gap figure of two equal-weight clients on a model of one input, one class, width 1 and rank 1:
    fc1 and fc2 each have a 1 x 1 A and B. `products`: the clients' (a, b) for both layers."""
    cfg = cfg_of(name, clients=2, **keys)
    flat, algo = built(cfg, input_shape=(1,), classes=1, width=1, rank=1)
    down = flat.vec.clone()
    for pair in algo.layout:        # the broadcast's adapters (1, 1): the uploads are changes from them
        pair.A(down).fill_(1.0)
        pair.B(down).fill_(1.0)
    total = torch.zeros(algo.dim, dtype=torch.float64)
    for cid, (a, b) in enumerate(products):
        acc, w = upload(algo, flat, down, cid, [(torch.tensor([[a]]), torch.tensor([[b]]))] * 2)
        total += acc
    algo.aggregate(down, total, 2.0, 0)
    return algo.round_metrics()["lora_product_gap"], algo.layout[0].scaling


@pytest.mark.parametrize("name,keys", [("flora", {}), ("fedit", {"product_gap": True})])
def test_product_gap_is_hand_computed(name, keys):
    # Clients (a, b) = (1, 1) and (3, 3): mean of products (1 + 9) / 2 = 5, product of means 2 * 2 = 4, so the
    # gap of each layer is s * 1 and over the two layers sqrt(2) s.
    gap, s = one_by_one_model_uploads(name, [(1.0, 1.0), (3.0, 3.0)], **keys)
    assert gap == pytest.approx(math.sqrt(2) * s, rel=1e-6)
    # Equal clients: no gap.
    gap, _ = one_by_one_model_uploads(name, [(2.0, 1.5), (2.0, 1.5)], **keys)
    assert gap == pytest.approx(0.0, abs=1e-9)


def test_fedit_measuring_the_gap_changes_nothing_it_averages():
    plain_flat, plain = built(cfg_of("fedit"))
    gap_flat, gap = built(cfg_of("fedit", product_gap=True))
    gen = torch.Generator().manual_seed(3)
    ups = [random_adapters(plain.layout if hasattr(plain, "layout") else adapter_layout(plain_flat), gen)
           for _ in range(2)]
    means = []
    for flat, algo in ((plain_flat, plain), (gap_flat, gap)):
        down = flat.vec.clone()
        accs = [upload(algo, flat, down, cid, ad) for cid, ad in enumerate(ups)]
        mean = algo.aggregate(down, accs[0][0] + accs[1][0], 2.0, 0)
        means.append(mean[: plain_flat.n_params])
        if algo is gap:
            assert not mean[plain_flat.n_params:].any()     # the measured products are never applied
    assert torch.equal(means[0], means[1])


# -- refusals ------------------------------------------------------------------------------------------------
def shape_of(cfg, rank=4):
    torch.manual_seed(0)
    module = TinyLora((4,), 3, width=5, rank=rank) if cfg.model.name == LORA_MODEL else Plain((4,), 3, width=5)
    return FlatModel(prepare_model(cfg, module)).describe()


@pytest.mark.parametrize("name", ["fedit", "ffa_lora", "fedsa_lora", "hetlora", "flora"])
def test_every_rule_refuses_a_model_without_adapters(name):
    keys = {"ranks": [2, 4]} if name == "hetlora" else {}
    cfg = cfg_of(name, model="lora_nets:Plain", **keys)
    with pytest.raises(ConfigError, match=rf"algorithm.name = '{name}': trains LoRA adapters, but model.name = "
                                          r"'lora_nets:Plain' has no trainable parameter matching"):
        _check(cfg)


def _check(cfg):
    """The class's check on the model's shape, as the resolve step asks it."""
    lookup(cfg.algorithm.name).form(cfg.algorithm).check(cfg, shape_of(cfg))


@pytest.mark.parametrize("name,keys,cfg_extra,words", [
    ("hetlora", {}, {}, "algorithm.ranks = []: set the clients' ranks"),
    ("hetlora", {"ranks": [0, 4]}, {}, "algorithm.ranks = [0, 4]: every rank must be "),
    ("flora", {}, {"server": {"lr": 0.5}}, "server.lr = 0.5: algorithm.name = 'flora' adds the clients' summed "
                                           "products to the merged base as they are (x + update); use 1"),
    ("flora", {}, {"server": {"optimizer": "adam"}}, "server.optimizer = 'adam'"),
])
def test_bad_keys_are_refused_naming_the_key(name, keys, cfg_extra, words):
    cfg = cfg_of(name, cfg=cfg_extra, **keys)
    with pytest.raises(ConfigError) as e:
        _check(cfg)
    assert words in str(e.value)


@pytest.mark.parametrize("name", ["hetlora", "flora"])
def test_a_largest_rank_other_than_the_models_is_refused(name):
    with pytest.raises(ConfigError, match=r"algorithm.ranks = \[2, 3\]: every rank must be in 1..4 and the "
                                          r"largest 4, the model's LoRA rank"):
        built(cfg_of(name, ranks=[2, 3]))
