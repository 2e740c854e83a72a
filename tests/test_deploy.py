"""Deployment realism (issue 15), the self-contained pieces: config keys, availability and dropout, trace
files, the simulated clock with deadlines and over-selection, and update compression.

Statistical checks compare a mean of n keyed draws with its expectation within Z standard errors, the
standard error computed from the draw's exact variance; Z = 5 makes a false alarm about 6e-7 per
comparison, and the draws are fixed by their keys, so each check passes or fails the same way every time.
"""

import math

import numpy as np
import pytest
import torch

from fedmpi import config
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.deploy import availability as av
from fedmpi.deploy import compress as cp
from fedmpi.deploy.clock import Clock, client_rates, round_outcome
from fedmpi.deploy.keys import BandwidthConfig, ClientsConfig, CompressConfig, DeadlineConfig, SpeedConfig
from fedmpi.deploy.plan import Deployment
from fedmpi.deploy.traces import AVAILABILITY_COLUMNS, SPEED_COLUMNS, AvailabilityTrace, load_rates

Z = 5.0


def within(mean, expected, variance, n):
    """|mean - expected| <= Z standard errors, elementwise."""
    return np.abs(np.asarray(mean) - expected) <= Z * np.sqrt(np.asarray(variance) / n) + 1e-12


def messages(cls, **kwargs):
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    return info.value.messages


# -- keys --------------------------------------------------------------------------------------------

def test_clients_section_reports_every_problem_with_its_dotted_key():
    msgs = messages(ClientsConfig, availability_p=0.5, dropout=1.0, trace="t.csv", trace_period=-1.0)
    text = "\n".join(msgs)
    assert len(msgs) == 5
    assert "clients.availability_p = 0.5: only applies with availability: bernoulli" in text
    assert "clients.dropout = 1.0: must be a number in [0, 1)" in text
    assert "clients.trace = 't.csv': is only read with availability: trace" in text
    assert "clients.trace_period = -1.0: must be a number of seconds > 0 or null" in text
    (msg,) = messages(ClientsConfig, availability="trace")
    assert msg.startswith("clients.trace = None") and "client,start,end" in msg
    (msg,) = messages(ClientsConfig, availability="bernoulli", availability_p=0.0)
    assert msg == "clients.availability_p = 0.0: must be a number in (0, 1]"


def test_rate_sections_and_wrong_types_are_config_errors():
    (msg,) = messages(SpeedConfig, kind="trace")
    assert msg.startswith("clients.speed.trace = None") and "client,steps_per_s" in msg
    msgs = messages(BandwidthConfig, up=0.0, down="fast", sigma=-1.0)
    assert [m.split(" =")[0] for m in msgs] == ["clients.bandwidth.up", "clients.bandwidth.down",
                                               "clients.bandwidth.sigma"]
    (msg,) = messages(DeadlineConfig, deadline="10")
    assert msg.startswith("server.deadline = '10'")
    # a number where a path belongs would otherwise reach open() as a file descriptor
    (msg,) = messages(ClientsConfig, availability="trace", trace=5)
    assert msg == "clients.trace = 5: must be a file path or null"
    (msg,) = messages(SpeedConfig, kind="trace", trace=3)
    assert msg == "clients.speed.trace = 3: must be a file path or null"


def test_compress_section_ranges():
    msgs = messages(CompressConfig, name="topk", fraction=1.5, levels=0)
    assert [m.split(" =")[0] for m in msgs] == ["client.compress.fraction", "client.compress.levels"]
    (msg,) = messages(CompressConfig, error_feedback=True)
    assert msg.startswith("client.compress.error_feedback = True: needs a compressor")
    assert CompressConfig(name="qsgd", levels=4, error_feedback=True).levels == 4


def test_over_select_counts_and_fractions():
    assert DeadlineConfig().selected(10, 100) == 10
    assert DeadlineConfig(over_select=0).extra(10) == 0
    assert DeadlineConfig(over_select=0.3).extra(10) == 3       # 0.3 * 10 is 3.0000000000000004 in floats
    assert DeadlineConfig(over_select=0.25).extra(10) == 3      # 2.5 rounded up
    assert DeadlineConfig(over_select=2).extra(10) == 2
    assert DeadlineConfig(over_select=2.0).extra(10) == 2
    assert DeadlineConfig(over_select=5).selected(10, 12) == 12
    for bad in (1.5, -1):
        (msg,) = messages(DeadlineConfig, over_select=bad)
        assert msg.startswith(f"server.over_select = {bad!r}: must be a fraction in (0, 1)")


def test_sections_build_through_the_config_builder():
    """config.py's builder reads these classes' annotations from this module: nested sections, types and
    unknown keys work as in the core sections (the lead wires them into Config)."""
    errors = []
    built = config._build(ClientsConfig, {"availability": "bernoulli", "availability_p": 0.8,
                                          "speed": {"kind": "lognormal", "value": 20}}, "clients", errors)
    assert errors == [] and built.speed == SpeedConfig(kind="lognormal", value=20.0) and built.availability_p == 0.8
    config._build(ClientsConfig, {"availability": "sometimes", "speed": {"vlue": 2}, "dropout": 2}, "clients", errors)
    assert errors[0].startswith("clients.availability = 'sometimes': must be one of always, bernoulli, trace")
    assert "unknown key 'clients.speed.vlue' (did you mean 'value'?)" in errors
    assert "clients.dropout = 2.0: must be a number in [0, 1)" in errors


# -- availability, dropout, selection ----------------------------------------------------------------

def test_selection_with_everyone_available_is_todays_selection_bit_for_bit():
    cfg = ClientsConfig()
    for seed, round_, n, s in [(0, 0, 30, 10), (3, 17, 100, 7), (1, 5, 12, 12), (2, 9, 20000, 40), (4, 2, 5, 1)]:
        mask = av.available(cfg, seed, round_, 123.0, n)
        assert mask.all() and mask.shape == (n,)
        got = av.select_available(seed, round_, mask, s)
        want = rng.select_clients(seed, round_, n, s)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_bernoulli_availability_rate_and_per_client_keys():
    cfg = ClientsConfig(availability="bernoulli", availability_p=0.3)
    masks = np.array([av.available(cfg, 7, t, 0.0, 200) for t in range(50)])
    n = masks.size
    assert within(masks.mean(), 0.3, 0.3 * 0.7, n)
    # a client's availability depends on (seed, round, client) only, not on how many clients exist
    assert np.array_equal(av.available(cfg, 7, 3, 0.0, 50), masks[3, :50])
    assert not np.array_equal(masks[3], masks[4])


def test_selection_among_available_clients():
    mask = np.zeros(40, dtype=bool)
    mask[[1, 4, 9, 16, 25, 36]] = True
    picked = av.select_available(2, 5, mask, 4)
    assert len(picked) == 4 and mask[picked].all() and np.all(np.diff(picked) > 0)
    assert np.array_equal(picked, av.select_available(2, 5, mask, 4))
    assert np.array_equal(av.select_available(2, 5, mask, 10), np.flatnonzero(mask))   # fewer than S: all of them
    assert av.select_available(2, 5, np.zeros(40, dtype=bool), 4).size == 0


def test_dropout_rate_and_determinism():
    assert not any(av.dropped(0, t, c, 0.0) for t in range(20) for c in range(20))
    draws = np.array([[av.dropped(3, t, c, 0.2) for c in range(100)] for t in range(100)])
    assert within(draws.mean(), 0.2, 0.2 * 0.8, draws.size)
    assert draws[5, 7] == av.dropped(3, 5, 7, 0.2)


# -- trace files ---------------------------------------------------------------------------------------

def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_availability_trace_intervals_devices_and_period(tmp_path):
    path = write(tmp_path, "avail.csv", "# measured on 3 phones\nclient,start,end\n0,0,10\n0,20,inf\n\n"
                                       "2, 5, 15\n")
    trace = AvailabilityTrace.load(path)
    # device 1 has no row: never on; client 4 follows device 4 mod 3 = 1, client 5 device 2
    assert trace.mask(0.0, 6).tolist() == [True, False, False, True, False, False]
    assert trace.mask(10.0, 6).tolist() == [False, False, True, False, False, True]   # [0, 10) excludes 10
    assert trace.mask(1e9, 3).tolist() == [True, False, False]
    cfg = ClientsConfig(availability="trace", trace=path)
    assert av.available(cfg, 0, 0, 7.0, 3).tolist() == [True, False, True]
    assert av.next_available_time(cfg, 16.0, 3) == 20.0
    assert av.next_available_time(ClientsConfig(), 16.0, 3) == 16.0

    repeating = write(tmp_path, "day.csv", "client,start,end\n0,2,4\n1,6,8\n")
    cfg = ClientsConfig(availability="trace", trace=repeating, trace_period=10.0)
    assert av.available(cfg, 0, 0, 23.0, 2).tolist() == [True, False]      # 23 mod 10 = 3
    assert av.next_available_time(cfg, 28.5, 2) == 32.0                   # 8.5 in the period: next 2 + 10
    assert AvailabilityTrace.load(repeating).next_on(9.0, 2) == math.inf    # no period: over for good


@pytest.mark.parametrize("text, fragment", [
    ("client,begin,end\n0,0,1\n", "line 1: header 'client,begin,end'; expected client,start,end"),
    ("client,start,end\n0,0\n", "line 2: 2 values; expected 3"),
    ("# x\nclient,start,end\n0,0,1\n-1,0,1\n", "line 4: client '-1' must be an integer >= 0"),
    ("client,start,end\n0,a,1\n", "line 2: start 'a' must be a finite number >= 0"),
    ("client,start,end\n0,3,3\n", "line 2: end '3' must be greater than start '3'"),
    ("client,start,end\n", "has no rows"),
])
def test_availability_trace_errors_name_file_and_line(tmp_path, text, fragment):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(InputError) as info:
        AvailabilityTrace.load(path)
    assert path in str(info.value) and fragment in str(info.value)


def test_trace_beyond_its_period_and_missing_file_are_input_errors(tmp_path):
    path = write(tmp_path, "day.csv", "client,start,end\n0,2,12\n")
    with pytest.raises(InputError, match=r"day.csv, line 2: end '12' lies beyond clients.trace_period \(10"):
        AvailabilityTrace.load(path, period=10.0)
    cfg = ClientsConfig(availability="trace", trace=str(tmp_path / "none.csv"))
    with pytest.raises(InputError, match="none.csv' not found"):
        av.available(cfg, 0, 0, 0.0, 3)


def test_rate_traces_map_clients_to_devices_and_report_errors(tmp_path):
    path = write(tmp_path, "speed.csv", "client,steps_per_s\n1,4.5\n0,2\n")
    assert load_rates(path, SPEED_COLUMNS).tolist() == [[2.0], [4.5]]
    cfg = ClientsConfig(speed=SpeedConfig(kind="trace", trace=path))
    speed, _, _ = client_rates(cfg, 0, 5)
    assert speed.tolist() == [2.0, 4.5, 2.0, 4.5, 2.0]
    for text, fragment in [("client,steps_per_s\n0,1\n0,2\n", "line 3: client 0 is listed twice (first on line 2)"),
                           ("client,steps_per_s\n0,1\n2,2\n", "no row for client 1"),
                           ("client,steps_per_s\n0,0\n", "line 2: steps_per_s '0' must be a finite number > 0"),
                           ("client,start,end\n0,1,2\n", "expected client,steps_per_s")]:
        bad = write(tmp_path, "bad_speed.csv", text)
        with pytest.raises(InputError) as info:
            load_rates(bad, SPEED_COLUMNS)
        assert bad in str(info.value) and fragment in str(info.value)
    assert AVAILABILITY_COLUMNS == ("client", "start", "end")


# -- the clock -----------------------------------------------------------------------------------------

def test_client_time_by_hand():
    cfg = ClientsConfig(speed=SpeedConfig(value=10.0), bandwidth=BandwidthConfig(up=1000.0, down=2000.0))
    clock = Clock.from_config(cfg, seed=0, num_clients=4)
    # download 4000 B at 2000 B/s = 2 s, 50 steps at 10 steps/s = 5 s, upload 1000 B at 1000 B/s = 1 s
    assert clock.client_time(3, steps=50, bytes_down=4000, bytes_up=1000) == 8.0
    assert clock.failure_time(3, steps=50, bytes_down=4000) == 7.0
    times = clock.finish_times([0, 2], steps=[50, 10], bytes_down=4000, bytes_up=1000, returned=[True, False])
    assert times.tolist() == [8.0, 3.0]


def test_lognormal_rates_are_keyed_per_client_and_independent_of_each_other():
    cfg = ClientsConfig(speed=SpeedConfig(kind="lognormal", value=10.0, sigma=0.5),
                        bandwidth=BandwidthConfig(kind="lognormal", up=1e5, down=4e5, sigma=0.8))
    speed, up, down = client_rates(cfg, 11, 4000)
    z = rng.stream(11, rng.CLOCK, 17).standard_normal(3)
    assert np.allclose([speed[17], up[17], down[17]], [10 * np.exp(0.5 * z[0]), 1e5 * np.exp(0.8 * z[1]),
                                                       4e5 * np.exp(0.8 * z[2])])
    # log(speed) ~ N(log 10, 0.5^2): its mean and the median sit where the parameters say
    assert within(np.log(speed).mean(), np.log(10.0), 0.25, speed.size)
    assert within(np.log(up).mean(), np.log(1e5), 0.64, up.size)
    # changing the bandwidth's form leaves the speed draws alone; fewer clients, same per-client rates
    fixed_bw = ClientsConfig(speed=cfg.speed)
    assert np.array_equal(client_rates(fixed_bw, 11, 4000)[0], speed)
    assert np.array_equal(client_rates(cfg, 11, 30)[2], down[:30])


def test_round_outcomes_by_hand():
    cids = np.array([3, 5, 8, 11])
    all_back = [True] * 4
    # no deadline: everyone counts, the server waits for the slowest
    out = round_outcome(cids, [3.0, 8.0, 5.0, 12.0], all_back, keep=4)
    assert out.kept.tolist() == [3, 5, 8, 11] and out.duration == 12.0 and out.late.size == 0
    # deadline 10: client 11 misses it; the server cannot know it will, so it waits until 10
    out = round_outcome(cids, [3.0, 8.0, 5.0, 12.0], all_back, keep=4, deadline=10.0)
    assert out.kept.tolist() == [3, 5, 8] and out.late.tolist() == [11] and out.duration == 10.0
    # everyone inside the deadline: the round ends at the last arrival
    assert round_outcome(cids, [3.0, 8.0, 5.0, 6.0], all_back, keep=4, deadline=10.0).duration == 8.0
    # a dropout is known at its failure time (9): without a deadline the round lasts until then
    out = round_outcome(cids, [3.0, 9.0, 5.0, 6.0], [True, False, True, True], keep=4)
    assert out.kept.tolist() == [3, 8, 11] and out.failed.tolist() == [5] and out.duration == 9.0
    # over-selection, keep the first 2 of 4 arrivals: clients 5 (at 2) and 11 (at 4)
    out = round_outcome(cids, [6.0, 2.0, 9.0, 4.0], all_back, keep=2)
    assert out.kept.tolist() == [5, 11] and out.late.tolist() == [3, 8] and out.duration == 4.0
    # over-selection with dropouts: only one arrives, the round ends when the last one has failed (9)
    out = round_outcome(cids[:3], [6.0, 2.0, 9.0], [True, False, False], keep=2)
    assert out.kept.tolist() == [3] and out.failed.tolist() == [5, 8] and out.duration == 9.0
    # over-selection and a deadline: 3 of 4 arrive by 7, the third at 6 closes the round
    out = round_outcome(cids, [6.0, 2.0, 9.0, 4.0], all_back, keep=3, deadline=7.0)
    assert out.kept.tolist() == [3, 5, 11] and out.duration == 6.0
    # ties are broken by client id; an empty round takes no time
    assert round_outcome([4, 9, 2], [5.0, 5.0, 5.0], [True] * 3, keep=2).kept.tolist() == [2, 4]
    assert round_outcome([], [], [], keep=0).duration == 0.0


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


# -- one round's plan ----------------------------------------------------------------------------------

def test_default_plan_is_inert_and_selects_todays_clients():
    dep = Deployment(ClientsConfig(), DeadlineConfig(), seed=4, num_clients=30, per_round=10)
    assert dep.inert
    for t in range(5):
        plan = dep.plan(t, 0.0, steps=np.full(30, 20), bytes_down=4000, bytes_up=4000)
        assert np.array_equal(plan.selected, rng.select_clients(4, t, 30, 10))
        assert plan.returned.all() and np.array_equal(plan.outcome.kept, plan.selected)
        # fixed defaults: 4000 B at 1e6 B/s each way + 20 steps at 10 steps/s
        assert plan.outcome.duration == pytest.approx(0.004 + 2.0 + 0.004)


def test_plan_composes_dropout_over_selection_and_the_clock():
    clients = ClientsConfig(dropout=0.3, speed=SpeedConfig(kind="lognormal", value=5.0, sigma=1.0),
                            bandwidth=BandwidthConfig(up=100.0, down=1000.0))
    dep = Deployment(clients, DeadlineConfig(deadline=30.0, over_select=0.5), seed=2, num_clients=40, per_round=6)
    assert not dep.inert
    steps = np.arange(40) % 7 + 10
    plan = dep.plan(3, 100.0, steps, bytes_down=2000, bytes_up=500)
    assert np.array_equal(plan.selected, rng.select_clients(2, 3, 40, 9))       # 6 + ceil(0.5 * 6)
    assert plan.returned.tolist() == [not av.dropped(2, 3, c, 0.3) for c in plan.selected]
    speed = client_rates(clients, 2, 40)[0]
    finish = [2.0 + steps[c] / speed[c] + (5.0 if back else 0.0) for c, back in zip(plan.selected, plan.returned)]
    arrivals = sorted((f, c) for f, c, back in zip(finish, plan.selected, plan.returned) if back and f <= 30.0)
    if len(arrivals) >= 6:
        kept, duration = sorted(c for _, c in arrivals[:6]), arrivals[5][0]
    else:
        kept, duration = sorted(c for _, c in arrivals), min(30.0, max(finish))
    assert plan.outcome.kept.tolist() == kept and plan.outcome.duration == pytest.approx(duration)
    assert plan.end == pytest.approx(100.0 + duration) and plan.start == 100.0
    assert all(plan.counts(c) == (c in kept) for c in range(40))


def test_plan_waits_for_the_trace_and_empties_rounds_after_it_ends(tmp_path):
    path = write(tmp_path, "late.csv", "client,start,end\n0,50,60\n1,55,70\n2,80,90\n")
    clients = ClientsConfig(availability="trace", trace=path)
    dep = Deployment(clients, DeadlineConfig(), seed=0, num_clients=6, per_round=2)
    plan = dep.plan(0, 10.0, np.full(6, 10), bytes_down=0, bytes_up=0)
    assert plan.start == 50.0 and plan.selected.tolist() == [0, 3]              # devices 0 (clients 0, 3) open at 50
    later = dep.plan(1, 95.0, np.full(6, 10), bytes_down=0, bytes_up=0)
    assert later.start == 95.0 and later.selected.size == 0 and later.end == 95.0
    with pytest.raises(InputError, match="missing.csv' not found"):
        Deployment(ClientsConfig(availability="trace", trace=str(tmp_path / "missing.csv")), DeadlineConfig(), 0, 6, 2)
