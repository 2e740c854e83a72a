"""Deployment realism (issue 15), the self-contained pieces: config keys, availability and dropout, trace
files, the simulated clock with deadlines and over-selection, and one round's plan. Update compression is
tests/test_deploy_compress.py.

Statistical checks compare a mean of n keyed draws with its expectation within Z standard errors, the
standard error computed from the draw's exact variance; Z = 5 makes a false alarm about 6e-7 per
comparison, and the draws are fixed by their keys, so each check passes or fails the same way every time.
"""

import math

import numpy as np
import pytest

from fedmpi import config
from fedmpi.core import rng
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.deploy import availability as av
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
