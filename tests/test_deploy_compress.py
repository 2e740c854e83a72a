"""Deployment realism (issue 15), update compression on its own: payload bytes, top-k, rand-k, QSGD, scaled
sign and error feedback, each by hand or against its exact mean and variance (the statistical rule of
tests/test_deploy.py: within Z standard errors of keyed draws). Split from tests/test_deploy.py by topic (the
keys, availability, dropout, traces, the clock and a round's plan there)."""

import math

import numpy as np
import pytest
import torch
from test_deploy import within

from fedmpi.deploy import compress as cp
from fedmpi.deploy.keys import CompressConfig

# -- compression ---------------------------------------------------------------------------------------

def test_payload_bytes_by_hand():
    assert cp.Compressor().payload_bytes(1000) == 4000
    # topk 1% of 1000: 10 values (40 B) + 10 uint16 indices (20 B) beat a 125-byte mask
    assert cp.TopK(0.01).payload_bytes(1000) == 60
    # topk 50% of 1000: 500 values (2000 B) + the 125-byte mask, smaller than 500 uint16 indices
    assert cp.TopK(0.5).payload_bytes(1000) == 2125
    # 256 entries fit uint8 indices, 257 need uint16; 100000 need uint32
    assert cp.TopK(2 / 256).payload_bytes(256) == 8 + 2
    assert cp.TopK(2 / 257).payload_bytes(257) == 8 + 4
    assert cp.TopK(0.001).payload_bytes(100_000) == 400 + 400
    assert cp.RandK(0.01).payload_bytes(1000) == 40
    # qsgd: 4-byte norm + per entry 1 sign bit + ceil(log2(s + 1)) level bits
    assert cp.QSGD(16).payload_bytes(1000) == 4 + 1000 * 6 // 8
    assert cp.QSGD(1).payload_bytes(1000) == 4 + 250
    assert cp.QSGD(3).payload_bytes(1001) == 4 + math.ceil(1001 * 3 / 8)
    assert cp.ScaledSign().payload_bytes(1000) == 129 and cp.ScaledSign().payload_bytes(1001) == 130
    x = torch.ones(1000)
    for c in (cp.Compressor(), cp.TopK(0.01), cp.RandK(0.01), cp.QSGD(16), cp.ScaledSign()):
        assert c(x, 0, 0, 0)[1] == c.payload_bytes(1000)


def test_kept_count_rounds_half_up_and_keeps_at_least_one():
    assert [cp.kept_count(f, d) for f, d in [(0.1, 15), (0.1, 14), (0.3, 10), (1e-6, 100), (1.0, 7)]] == [2, 1, 3, 1, 7]


def test_topk_keeps_the_largest_magnitudes():
    x = torch.tensor([0.1, -5.0, 3.0, -0.2, 4.0, 0.0])
    out, _ = cp.TopK(0.5)(x, 0, 0, 0)
    assert out.tolist() == [0.0, -5.0, 3.0, 0.0, 4.0, 0.0]


def test_topk_error_feedback_three_rounds_by_hand():
    """d = 4, k = 1.  round 1: v = [1, -3, 2, .5] -> send -3, e = [1, 0, 2, .5]
    round 2: v = [.5, 1, .5, -2] + e = [1.5, 1, 2.5, -1.5] -> send 2.5, e = [1.5, 1, 0, -1.5]
    round 3: v = [1, 0, -1, -.5] + e = [2.5, 1, -1, -2] -> send 2.5 (entry 0), e = [0, 1, -1, -2]"""
    ef = cp.UpdateCompression(CompressConfig(name="topk", fraction=0.25, error_feedback=True))
    deltas = [[1.0, -3.0, 2.0, 0.5], [0.5, 1.0, 0.5, -2.0], [1.0, 0.0, -1.0, -0.5]]
    sent = [[0.0, -3.0, 0.0, 0.0], [0.0, 0.0, 2.5, 0.0], [2.5, 0.0, 0.0, 0.0]]
    residuals = [[1.0, 0.0, 2.0, 0.5], [1.5, 1.0, 0.0, -1.5], [0.0, 1.0, -1.0, -2.0]]
    for t, delta in enumerate(deltas):
        c = ef.compress(torch.tensor(delta), seed=0, round_=t, cid=7)
        ef.commit(7, c)
        assert c.vector.tolist() == sent[t] and c.residual.tolist() == residuals[t]
        assert c.nbytes == 4 + 1                      # one value, one uint8 index (the 1-byte mask ties)
    assert ef.state(7)["compress_residual"].tolist() == residuals[-1]
    assert ef.state(8) == {}


def test_randk_is_unbiased_and_sends_exactly_k_scaled_entries():
    x = torch.from_numpy(np.random.default_rng(0).normal(size=15).astype(np.float32))
    d, k, n = 15, 2, 20000                            # k = round(0.1 * 15) = 2, so the scale is 7.5, not 10
    comp = cp.RandK(0.1)
    draws = torch.stack([comp(x, 1, t, 4)[0] for t in range(n)]).double()
    nonzero = draws != 0
    assert (nonzero.sum(1) == k).all()
    assert torch.allclose(draws[nonzero], (x.double() * d / k).expand(n, d)[nonzero])
    variance = x.double().numpy() ** 2 * (d / k - 1)  # x_j^2 (d/k)^2 (k/d)(1 - k/d)
    assert within(draws.mean(0).numpy(), x.double().numpy(), variance, n).all()
    # error feedback's form: the same entries, unscaled
    plain, _ = cp.RandK(0.1, scaled=False)(x, 1, 0, 4)
    assert torch.equal(plain * (d / k), comp(x, 1, 0, 4)[0])


def test_qsgd_is_unbiased_with_its_exact_variance():
    x = torch.from_numpy(np.random.default_rng(1).normal(size=10).astype(np.float32))
    s, n = 2, 20000
    comp = cp.QSGD(s)
    draws = torch.stack([comp(x, 2, t, 9)[0] for t in range(n)]).double().numpy()
    norm = float(torch.linalg.vector_norm(x))
    r = np.abs(x.double().numpy()) / norm * s
    q = r - np.floor(r)
    # every entry is norm * sign * (l or l + 1) / s
    levels = np.abs(draws) * s / norm
    assert np.allclose(levels, np.round(levels), atol=1e-4)
    assert np.all((np.round(levels) == np.floor(r)) | (np.round(levels) == np.floor(r) + 1))
    variance = norm ** 2 * q * (1 - q) / s ** 2
    assert within(draws.mean(0), x.double().numpy(), variance, n).all()
    assert torch.equal(comp(torch.zeros(10), 2, 0, 9)[0], torch.zeros(10))


def test_qsgd_for_error_feedback_is_the_same_draw_shrunk_by_one_plus_omega():
    x = torch.linspace(-1, 2, 64)
    plain, _ = cp.QSGD(4)(x, 0, 3, 1)
    shrunk, _ = cp.QSGD(4, shrink=True)(x, 0, 3, 1)
    omega = min(64 / 16, 8 / 4)
    assert torch.allclose(shrunk, plain / (1 + omega))


def test_scaled_sign_by_hand():
    out, nbytes = cp.ScaledSign()(torch.tensor([1.0, -2.0, 0.0, 3.0]), 0, 0, 0)
    assert out.tolist() == [1.5, -1.5, 1.5, 1.5] and nbytes == 4 + 1     # mean |x| = 1.5; sign(0) = +


def test_compression_is_a_function_of_its_keys():
    x = torch.linspace(-3, 3, 101)
    for comp in (cp.RandK(0.1), cp.QSGD(2)):
        a = comp(x, 5, 2, 3)[0]
        assert torch.equal(a, comp(x, 5, 2, 3)[0])
        for other in [(6, 2, 3, 0), (5, 1, 3, 0), (5, 2, 4, 0), (5, 2, 3, 1)]:
            assert not torch.equal(a, comp(x, *other)[0])


def test_error_feedback_residuals_do_not_depend_on_placement_and_survive_a_checkpoint():
    """Three clients over four rounds on one 'rank' against two 'ranks' that host them apart and restart
    from saved state after round 2: the same uploads and the same residuals."""
    cfg = CompressConfig(name="qsgd", levels=2, error_feedback=True)
    updates = {(t, c): torch.from_numpy(np.random.default_rng(10 * t + c).normal(size=50).astype(np.float32))
               for t in range(4) for c in range(3)}

    def play(ranks, hosts, rounds):
        sent = {}
        for t in rounds:
            for c in (2, 0, 1):
                comp = ranks[hosts[c]]
                out = comp.compress(updates[(t, c)], 9, t, c)
                if (t, c) != (1, 1):                  # client 1 drops in round 1: its residual stays
                    comp.commit(c, out)
                sent[(t, c)] = out.vector
        return sent

    one = cp.UpdateCompression(cfg)
    alone = play([one], [0, 0, 0], range(4))
    apart = [cp.UpdateCompression(cfg), cp.UpdateCompression(cfg)]
    first = play(apart, [0, 1, 0], range(2))
    saved = {c: apart[h].state(c) for c, h in enumerate([0, 1, 0])}
    resumed = [cp.UpdateCompression(cfg), cp.UpdateCompression(cfg)]
    for c, h in enumerate([1, 0, 1]):                 # resumed on a different placement
        resumed[h].load(c, saved[c])
    later = play(resumed, [1, 0, 1], range(2, 4))
    for key, vector in {**first, **later}.items():
        assert torch.equal(vector, alone[key]), key
    for c, h in enumerate([1, 0, 1]):
        assert np.array_equal(resumed[h].state(c)["compress_residual"], one.state(c)["compress_residual"])


def test_a_dropped_update_leaves_the_residual_unchanged():
    ef = cp.UpdateCompression(CompressConfig(name="topk", fraction=0.5, error_feedback=True))
    ef.commit(0, ef.compress(torch.tensor([1.0, 2.0]), 0, 0, 0))
    before = ef.state(0)["compress_residual"].copy()
    ef.compress(torch.tensor([5.0, -7.0]), 0, 1, 0)          # trained, then dropped: no commit
    assert np.array_equal(ef.state(0)["compress_residual"], before)
    assert cp.UpdateCompression(CompressConfig(name="topk")).compress(torch.ones(3), 0, 0, 0).residual is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compressors_give_the_cpu_result_on_cuda():
    x = torch.from_numpy(np.random.default_rng(3).normal(size=4099).astype(np.float32))
    for comp in (cp.TopK(0.01), cp.RandK(0.05), cp.QSGD(8), cp.ScaledSign()):
        cpu, n_cpu = comp(x, 1, 2, 3)
        gpu, n_gpu = comp(x.cuda(), 1, 2, 3)
        assert gpu.device.type == "cuda" and n_gpu == n_cpu
        assert torch.allclose(gpu.cpu(), cpu, rtol=1e-5, atol=1e-6), comp.name
