"""Secure aggregation (issue 26): the protocol's arithmetic by hand-checked cases and properties, the stage's
path from float updates to the decoded sum, the config's refusals. The -n 1 / -n 3 / resume runs are in
tests/test_secagg_mpi.py."""

import math
import os
import types

import numpy as np
import pytest
import torch
from conftest import VecModel, small_config, write_config

from fedmpi import config as fconfig
from fedmpi.algorithms.registry import lookup
from fedmpi.core import rng
from fedmpi.mpi.local import LocalComm
from fedmpi.plans.base import RoundPlan
from fedmpi.round.providers import SecureAggregation
from fedmpi.secagg import agreement, checks, masks, shamir
from fedmpi.secagg.graph import default_neighbours, harary, is_regular
from fedmpi.secagg.protocol import deal, masked_upload, setup, unmask
from fedmpi.secagg.stage import SecAggStage
from fedmpi.uploads.base import ClientUpdate, StageSetting, StageView

# -- Shamir ------------------------------------------------------------------------------------------------

def test_shamir_reconstructs_a_hand_made_polynomial():
    # f(x) = 7 + 2x + x^2: f(1) = 10, f(2) = 15, f(3) = 22, f(5) = 42.
    assert shamir.reconstruct({1: 10, 2: 15, 3: 22}, 3) == 7
    assert shamir.reconstruct({5: 42, 2: 15, 1: 10}, 3) == 7
    # Over the field: f(x) = (P - 1) + x, i.e. -1 + x: f(1) = 0, f(2) = 1.
    assert shamir.reconstruct({1: 0, 2: 1}, 2) == shamir.P - 1
    with pytest.raises(shamir.NotEnoughShares):
        shamir.reconstruct({1: 10, 2: 15}, 3)


def test_shamir_any_t_shares_give_the_secret_and_t_minus_1_do_not_determine_it():
    secret = 2 ** 64 - 5
    shares = shamir.share(secret, 4, range(1, 8), np.random.default_rng(3))
    for subset in ([1, 2, 3, 4], [7, 5, 3, 1], [2, 4, 6, 7]):
        assert shamir.reconstruct({x: shares[x] for x in subset}, 4) == secret
    # With 3 shares of a degree-3 polynomial, a wrong threshold interpolates a different (degree-2) value.
    assert shamir.reconstruct({x: shares[x] for x in (1, 2, 3)}, 3) != secret
    # A degree-0 sharing (t = 1) hands the secret to everyone.
    assert set(shamir.share(9, 1, [1, 2], np.random.default_rng(0)).values()) == {9}


# -- masks cancel ---------------------------------------------------------------------------------------------

def _qs(cohort, length, bits, seed=0):
    g = np.random.default_rng(seed)
    return {u: g.integers(-1000, 1000, length) for u in cohort}


@pytest.mark.parametrize("mode,k", [("secagg", None), ("secagg_plus", 4)])
@pytest.mark.parametrize("bits", [16, 32, 64])
def test_masks_cancel_exactly_with_and_without_dropouts(mode, k, bits):
    cohort = [1, 4, 5, 8, 9, 11, 13, 17]
    length, t = 300, (3 if mode == "secagg" else 2)     # SecAgg+: 5 holders per client, 3 may be gone
    s = setup(mode, cohort, k if k else len(cohort) - 1, t, bits, length, 7, 2)
    qs = _qs(cohort, length, bits)
    ys = {u: masked_upload(s, u, masks.to_ring(qs[u], bits))[0] for u in cohort}
    for survivors in (cohort, [1, 5, 8, 9, 13, 17], [4, 5, 9, 11, 13]):
        total = np.zeros(length, dtype=np.uint64)
        for u in survivors:
            total += ys[u]
        out = unmask(s, total, survivors)
        assert not out.failed, out.failed
        expected = np.sum([qs[u] for u in survivors], axis=0)
        assert np.array_equal(masks.from_ring(out.total, bits), expected)
        # Without unmasking, the survivors' sum is not the sum of their updates (masks remain).
        if len(survivors) < len(cohort):
            total &= masks.ring_mask(bits)
            assert not np.array_equal(masks.from_ring(total, bits), expected)


def test_recovery_fails_below_the_threshold():
    cohort = list(range(10))
    s = setup("secagg", cohort, 9, 6, 32, 50, 1, 0)
    ys = {u: masked_upload(s, u, masks.to_ring(np.zeros(50, np.int64), 32))[0] for u in cohort}
    for survivors, fails in ((cohort[:6], False), (cohort[:5], True), ([], True)):
        total = np.sum([ys[u] for u in survivors], axis=0, dtype=np.uint64) if survivors else np.zeros(50, np.uint64)
        out = unmask(s, total, survivors)
        assert (out.total is None) == fails and bool(out.failed) == fails
        if not fails:
            assert not out.total.any()


def test_one_masked_vector_is_uniform_and_the_clear_update_is_not():
    bits, length = 16, 40000
    s = setup("secagg", [0, 1, 2], 2, 2, bits, length, 5, 0)
    q = np.random.default_rng(0).integers(-50, 50, length)          # a typical small quantized update
    clear = masks.to_ring(q, bits)
    y, _ = masked_upload(s, 0, clear)
    assert not np.array_equal(y, clear)

    def chi2_of_top_bits(v):
        counts = np.bincount((v >> np.uint64(bits - 4)).astype(np.int64), minlength=16)
        expected = len(v) / 16
        return float(((counts - expected) ** 2 / expected).sum())

    # 15 degrees of freedom: P(chi2 > 37.7) = 0.001 under uniformity.
    assert chi2_of_top_bits(y) < 37.7
    assert chi2_of_top_bits(clear) > 1000


# -- SecAgg+ ---------------------------------------------------------------------------------------------------

def test_secagg_plus_masks_and_shares_with_neighbours_only():
    cohort = list(range(0, 24, 2))
    k, t, bits, length = 4, 3, 32, 64
    s = setup("secagg_plus", cohort, k, t, bits, length, 11, 3)
    assert is_regular(s.graph, k) and s.graph == harary(cohort, k, 11, 3)
    u = cohort[0]
    q = masks.to_ring(np.arange(length), bits)
    y, expansions = masked_upload(s, u, q)
    assert expansions == k + 1
    # y_u by hand: its self mask and the pairwise masks with its k neighbours, nobody else's.
    sk = agreement.secret_key(11, 3, u)
    by_hand = q + masks.expand(agreement.self_seed(11, 3, u), length, bits, masks.SELF)
    for v in s.graph[u]:
        m = masks.expand(agreement.agree(sk, s.public[v]), length, bits, masks.PAIR)
        by_hand = by_hand + m if u < v else by_hand - m
    assert np.array_equal(y, by_hand & masks.ring_mask(bits))
    # Shares go to the client and its neighbours only.
    assert sorted(s.holders(u)) == sorted([u, *s.graph[u]])
    assert set(deal(s, u, s.holders(u), "sk")) == {s.index[h] for h in s.holders(u)}
    # A dropped client w is recovered from its neighbours' shares: when all but t - 1 of its holders are
    # gone the round fails, although most of the cohort survives.
    w = cohort[5]
    gone = [w, *s.graph[w][: k - (t - 1)]]
    survivors = [c for c in cohort if c not in gone]
    ys = {c: masked_upload(s, c, masks.to_ring(np.zeros(length, np.int64), bits))[0] for c in cohort}
    total = np.sum([ys[c] for c in survivors], axis=0, dtype=np.uint64)
    out = unmask(s, total, survivors)
    assert out.total is None and out.failed      # someone lacks shares
    assert len(survivors) >= t
    # With one dropped client whose neighbours all survive, the sum is recovered; only w's key is rebuilt,
    # and only its k neighbours' pairwise masks are recomputed.
    survivors = [c for c in cohort if c != w]
    total = np.sum([ys[c] for c in survivors], axis=0, dtype=np.uint64)
    out = unmask(s, total, survivors)
    assert not out.failed and not out.total.any()
    assert [key for key in out.reconstructed if key[1] == "sk"] == [(w, "sk")]
    assert out.expansions == len(survivors) + k


def test_default_neighbours_is_about_log_n():
    assert [default_neighbours(n) for n in (3, 5, 20, 100, 1000)] == [2, 4, 6, 8, 10]


# -- the integer coding ------------------------------------------------------------------------------------------

def test_the_integer_reduction_takes_uint64_only_and_wraps():
    comm = LocalComm()
    with pytest.raises(TypeError, match="uint64"):
        comm.reduce_sum_mod(np.zeros(3), 16)
    buf = np.array([2 ** 64 - 1, 2 ** 16 + 5], dtype=np.uint64)
    assert comm.reduce_sum_mod(buf, 16).tolist() == [2 ** 16 - 1, 5]


def test_ring_coding_round_trips_signed_integers():
    q = np.array([-2 ** 15, -1, 0, 1, 2 ** 15 - 1])
    for bits in (16, 20, 64):
        assert np.array_equal(masks.from_ring(masks.to_ring(q, bits), bits), q)


def test_quantization_clips_then_rounds_without_bias():
    delta = np.array([3.0, 4.0])        # norm 5, clipped to 1: (0.6, 0.8)
    q, norm = masks.quantize(delta, 1.0, 10.0, np.random.default_rng(0))
    assert norm == 5.0 and q.tolist() == [6, 8]
    x = np.full(200000, 0.25)
    r = masks.stochastic_round(x, np.random.default_rng(1))
    assert set(np.unique(r)) == {0, 1} and abs(r.mean() - 0.25) < 0.005


@pytest.mark.parametrize("name", ["skellam", "discrete_gaussian"])
def test_integer_noise_has_the_asked_variance(name):
    z = masks.NOISE_SAMPLERS[name](7.0, 200000, np.random.default_rng(2))
    assert z.dtype == np.int64 and abs(z.mean()) < 0.1 and abs(z.std() / 7.0 - 1) < 0.01


# -- the stage: float updates to the decoded sum ---------------------------------------------------------------

def _cfg(tmp_path, **secagg):
    server = {"clients_per_round": 6, "secure_aggregation": secagg.pop("mode", "secagg")}
    server.update(secagg.pop("server", {}))
    extra = {k: secagg.pop(k) for k in ("client", "privacy", "algorithm") if k in secagg}
    return fconfig.from_dict(small_config(tmp_path, server=server, secagg=secagg, **extra))


def _stage(cfg, dim):
    """The stage as a run builds it, from its sections alone (rank 0: told the accountant's curve)."""
    setting = StageSetting(types.SimpleNamespace(up_vectors=1, dim=dim), dim, on_server=True)
    return SecureAggregation.build(setting, secagg=cfg.secagg, server=cfg.server, client=cfg.client,
                                   partition=cfg.partition, rounds=cfg.rounds, seed=cfg.seed)


def _server(stage, plan, sums, weight, dim):
    """Rank 0 after the reductions: the stage's server hook with its two scalar sums as its view."""
    return stage.server(sums, weight, StageView(plan, (), sums[dim: dim + stage.up_scalars]))


@pytest.mark.parametrize("mode", ["secagg", "secagg_plus"])
def test_the_stage_decodes_the_sum_of_the_survivors_quantized_updates_bit_for_bit(tmp_path, mode):
    cfg = _cfg(tmp_path, mode=mode, bits=24, clip=0.5, scale=1000.0, threshold=3)
    dim = 40
    stage = _stage(cfg, dim)
    selected = np.array([0, 2, 3, 5, 7, 9])
    counted = np.array([True, False, True, True, False, True])
    plan = RoundPlan(4, selected, selected, counted)
    stage.begin(plan, StageView(plan))
    down = torch.randn(dim, generator=torch.Generator().manual_seed(99)) * 0.1
    expected = np.zeros(dim, dtype=np.int64)
    acc = torch.zeros(dim + stage.up_scalars, dtype=torch.float64)
    total = stage.zeros()
    for cid in selected[counted]:
        model = VecModel(dim)
        model.vec = down + torch.randn(dim, generator=torch.Generator().manual_seed(int(cid))) * 0.3
        delta = (model.vec - down).double().numpy()
        q, _ = masks.quantize(delta, 0.5, 1000.0, rng.stream(cfg.seed, rng.SECAGG, 4, cid, agreement.ROUNDING))
        expected += q
        update = stage.client(ClientUpdate(int(cid), 4, model.vec, down, 10.0), StageView(plan))
        assert update.weight == 1.0 and update.bytes > 3 * dim
        assert torch.allclose(model.vec, down + torch.from_numpy(q / 1000.0).float())
        acc[:dim] += (model.vec - down).double()
        acc[dim:] += torch.tensor(update.scalars["secagg"], dtype=torch.float64)
        np.add(total, update.encoded, out=total)        # what the transport sums (SecureReduce)
    LocalComm().reduce_sum_mod(total, stage.bits)
    assert stage.own_vector_transport       # the float reduction leaves acc[:dim] out (measured below)
    sums = acc.clone()
    weight, figures = stage.decode(plan, total, sums, 4.0)
    assert weight == 4.0
    assert torch.equal(sums[:dim], torch.from_numpy(expected / 1000.0))
    figures.update(_server(stage, plan, sums, weight, dim)[2])
    assert figures["secagg_failed"] == 0 and figures["secagg_survivors"] == 4 and figures["secagg_dropped"] == 2
    assert figures["secagg_messages"] == 4 * 6 + 3 * 4
    assert figures["secagg_clipped_fraction"] == 1.0        # norms ~ 0.3 sqrt(40) > clip 0.5
    assert figures["secagg_zeroed_updates"] == 0.0          # every update finite


def test_the_stage_fails_the_round_below_the_threshold(tmp_path):
    cfg = _cfg(tmp_path, threshold=5)
    dim = 8
    stage = _stage(cfg, dim)
    selected = np.arange(6)
    plan = RoundPlan(0, selected, selected, np.array([True, True, True, True, False, False]))
    stage.begin(plan, StageView(plan))
    total = stage.zeros()
    for cid in range(4):
        model = VecModel(dim)
        model.vec = torch.ones(dim)
        update = stage.client(ClientUpdate(cid, 0, model.vec, torch.zeros(dim), 5.0), StageView(plan))
        np.add(total, update.encoded, out=total)
    sums = torch.ones(dim + 2, dtype=torch.float64)
    LocalComm().reduce_sum_mod(total, stage.bits)
    weight, figures = stage.decode(plan, total, sums, 4.0)
    assert weight == 0.0 and not sums[:dim].any()
    assert figures["secagg_failed"] == 1.0


# -- bad input ------------------------------------------------------------------------------------------------------

def _problems(tmp_path, **kw):
    cfg = _cfg(tmp_path, **kw)
    return " | ".join(checks.problems(cfg, lookup(cfg.algorithm.name)))


def test_bad_input_is_refused_naming_the_keys(tmp_path):
    assert _problems(tmp_path) == ""
    small = _problems(tmp_path, bits=16, clip=1.0, scale=65536.0)
    p = checks.plan_of(_cfg(tmp_path, bits=40, clip=1.0, scale=65536.0))
    assert p.bound == 6 * (65536 + 1) and f"needs bits >= {p.min_bits}" in small and "secagg.bits = 16" in small
    assert p.min_bits == 20 and "needs bits >= 21" in _problems(tmp_path, bits=20, scale=2.0 ** 17)
    assert "secagg.threshold = 7" in _problems(tmp_path, threshold=7) and "half" in _problems(tmp_path, threshold=7)
    assert "secagg.threshold = 0" in _problems(tmp_path, threshold=0)
    assert "secagg.neighbours = 6" in _problems(tmp_path, mode="secagg_plus", neighbours=6)
    assert "secagg.neighbours = 3" in _problems(tmp_path, mode="secagg_plus", neighbours=3)
    assert "secagg.threshold = 4" in _problems(tmp_path, mode="secagg_plus", neighbours=2, threshold=4)
    assert "only secagg_plus" in _problems(tmp_path, neighbours=2)
    assert "client.compress.name = 'topk'" in _problems(tmp_path, client={"compress": {"name": "topk"}})
    assert _problems(tmp_path, client={"compress": {"name": "randk", "fraction": 0.1}}) == ""
    assert "privacy.mechanism" in _problems(tmp_path, privacy={"mechanism": "gaussian", "delta": 1e-3})
    assert "'scaffold'" in _problems(tmp_path, algorithm={"name": "scaffold"})
    assert "'fedskip'" in _problems(tmp_path, algorithm={"name": "fedskip"})
    assert "'fednova'" in _problems(tmp_path, algorithm={"name": "fednova"})
    assert "'central'" in _problems(tmp_path, algorithm={"name": "central"})
    assert "select at least 2" in _problems(tmp_path, server={"clients_per_round": 1})
    assert "server.sampling" in _problems(tmp_path, server={"sampling": "poisson"})
    unused = fconfig.from_dict(small_config(tmp_path, secagg={"bits": 20}))
    assert "server.secure_aggregation is none" in checks.problems(unused, lookup("fedavg"))[0]
    # A robust aggregator (server.aggregator, from another branch) is refused whenever it is there.
    cfg = _cfg(tmp_path)
    robust = types.SimpleNamespace(**{**vars(cfg.server), "aggregator": "median"})
    robust.straggler_policy = cfg.server.straggler_policy
    found = checks.problems(types.SimpleNamespace(**{**vars(cfg), "server": robust}), lookup("fedavg"))
    assert any("server.aggregator = 'median'" in f for f in found)
    assert checks.warnings(_cfg(tmp_path, threshold=2), lookup("fedavg"))
    assert not checks.warnings(_cfg(tmp_path, threshold=4), lookup("fedavg"))


def test_a_bad_config_exits_2_before_any_file_is_written(tmp_path):
    from fedmpi.cli import main

    out = tmp_path / "never"
    path = tmp_path / "bad.yaml"
    write_config(path, small_config(out, server={"clients_per_round": 5, "secure_aggregation": "secagg"},
                                    secagg={"bits": 8}))
    assert main(["run", str(path)]) == 2
    assert not out.exists() or sorted(os.listdir(out)) == [".fedmpi.lock"]     # out is claimed first, nothing more
    with pytest.raises(fconfig.ConfigError, match="secagg.bits"):
        fconfig.from_dict(small_config(out, secagg={"bits": 80}))


def test_the_section_at_its_defaults_leaves_the_hash_alone(tmp_path):
    base = fconfig.from_dict(small_config(tmp_path))
    same = fconfig.from_dict(small_config(tmp_path, server={"clients_per_round": 5,
                                                           "secure_aggregation": "none"}, secagg={}))
    assert base.hash() == same.hash()
    assert _cfg(tmp_path).hash() != base.hash()
    assert math.isfinite(checks.plan_of(_cfg(tmp_path)).bound)


def test_at_its_limit_secure_aggregation_is_fedavg(tmp_path):
    """With equal client sizes (FedAvg's weights n_i are then uniform), a clip no update reaches and the
    finest scale of a 64-bit field, SecAgg's model equals FedAvg's up to the rounding step 2^-40 (per entry,
    per round), dropouts included: the masks cancel, and the only difference left is the quantization.
    A mask left in the sum would move the model by ~2^63 / 2^40 per entry."""
    import fedmpi

    base = small_config(tmp_path, rounds=2, partition={"clients": 10, "scheme": "iid"},
                        server={"clients_per_round": 5}, clients={"dropout": 0.3})
    clear = fedmpi.simulate(base)
    masked = fedmpi.simulate({**base, "server": {"clients_per_round": 5, "secure_aggregation": "secagg"},
                              "secagg": {"bits": 64, "clip": 1.0e5, "scale": 2.0 ** 40}})
    assert (masked.metrics["secagg_dropped"] > 0).any() and not masked.metrics["secagg_failed"].any()
    assert (masked.metrics["secagg_server_prg"] > 0).all()      # the sum came through the unmasking
    # 2^-40 is below float32's resolution of the model's entries: at most one ulp apart (equal in practice).
    assert np.abs(clear.model - masked.model).max() <= 1e-7


def test_a_secure_round_reduces_no_float_model_vector(tmp_path, monkeypatch):
    """Issue 37: under secure aggregation the model update travels only as masked integers. Every float
    reduction of a round is measured (LocalComm.reduce_sum wrapped): without secure aggregation one
    carries the d-long model sum; with it, none reaches d entries, and the integer reduction carries the
    masked vector (d entries of uint64). The decoded model still equals FedAvg's to float rounding."""
    import fedmpi

    reduced = []
    plain_reduce, plain_mod = LocalComm.reduce_sum, LocalComm.reduce_sum_mod
    monkeypatch.setattr(LocalComm, "reduce_sum", lambda self, buf: (reduced.append(("float", buf.dtype, buf.size)),
                                                                      plain_reduce(self, buf))[1])
    monkeypatch.setattr(LocalComm, "reduce_sum_mod", lambda self, buf, bits: (
        reduced.append(("ring", buf.dtype, buf.size)), plain_mod(self, buf, bits))[1])
    base = small_config(tmp_path, rounds=2, partition={"clients": 10, "scheme": "iid"},
                        server={"clients_per_round": 5})
    clear = fedmpi.simulate(base)
    dim = clear.model.size
    float_sizes = [size for kind, _, size in reduced if kind == "float"]
    assert sorted(float_sizes)[-2:] == [max(float_sizes)] * 2 and max(float_sizes) > dim   # the model sum inside
    reduced.clear()
    masked = fedmpi.simulate({**base, "server": {"clients_per_round": 5, "secure_aggregation": "secagg"},
                              "secagg": {"bits": 64, "clip": 1.0e5, "scale": 2.0 ** 40}})
    floats = [size for kind, _, size in reduced if kind == "float"]
    rings = [(dtype, size) for kind, dtype, size in reduced if kind == "ring"]
    assert len(floats) == len(float_sizes) and max(floats) < dim
    # The round's reduction is the same buffer less the model's d float64 (8 d bytes a round), plus the
    # stage's own two scalars (its masking seconds and clipped count):
    assert max(floats) == max(float_sizes) - dim + SecAggStage.up_scalars
    assert rings == [(np.dtype(np.uint64), dim)] * 2
    assert np.abs(clear.model - masked.model).max() <= 1e-7
