"""Robust aggregation (issue 25, part 1): the rules' arithmetic on hand-computed matrices, their limits that
equal FedAvg, chunked == unchunked for every rule and attack, the omniscient attacks' formulas, the config's
refusals, and short in-process runs of the chunked gather (tests/test_robust_mpi.py has the -n and resume
checks)."""

import math

import numpy as np
import pytest
from conftest import small_config, write_config

from fedmpi import config
from fedmpi.attacks.keys import AttackConfig
from fedmpi.attacks.omniscient import OmniscientAttack, largest_gamma, z_max
from fedmpi.cli import main
from fedmpi.core.errors import ConfigError
from fedmpi.robust import aggregators as agg
from fedmpi.robust.chunks import BYTES_PER_ENTRY, chunk_bounds, chunk_width
from fedmpi.robust.driver import aggregate_chunks
from fedmpi.robust.keys import RobustConfig
from fedmpi.robust.rules import RULES, build_rule, bulyan_f, krum_f
from fedmpi.round.robust_gather import detection


def run_rule(name, rows, w=None, *, block=4, width=None, attack=None, g0=None, **keys):
    rows = np.asarray(rows, dtype=np.float32)
    n, d = rows.shape
    w = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    width = width or max(block, d)
    return aggregate_chunks(build_rule(name, RobustConfig(**keys)), lambda lo, hi: rows[:, lo:hi].copy(), w, d,
                            width, block=block, attack=attack, server_update=g0)


# -- the pure functions, by hand -------------------------------------------------------------------------

def test_coordinate_median_and_trimmed_mean_by_hand():
    values, used = agg.coordinate_median([[1, 5], [2, 0], [10, 3]])
    assert values.tolist() == [2, 3] and used.tolist() == [0, 1, 1]
    assert agg.coordinate_median([[1], [3], [5], [100]])[0].tolist() == [4.0]      # even n: the middle two
    values, used = agg.trimmed_mean([[1], [2], [3], [100]], 1)
    assert values.tolist() == [2.5] and used.tolist() == [0, 1, 1, 0]
    with pytest.raises(ValueError):
        agg.trimmed_mean([[1], [2]], 1)


def test_krum_scores_and_selection_by_hand():
    points = np.array([[0], [1], [2], [3], [20]], dtype=np.float64)
    dist = agg.sq_distances(agg.gram(points))
    assert agg.krum_scores(dist, 1).tolist() == [5, 2, 2, 5, 613]     # sums of the n - f - 2 = 2 closest
    assert agg.krum_order(dist, 1)[:2].tolist() == [1, 2]               # a tie goes to the lower id
    assert agg.multi_krum_select(dist, 1, 3).tolist() == [0, 1, 2]
    out = run_rule("krum", points, f=1)
    assert out.update.tolist() == [1.0] and out.weights.tolist() == [0, 1, 0, 0, 0]
    out = run_rule("multi_krum", points, [1, 1, 2, 1, 1], f=1, m=3)
    assert out.update.tolist() == [pytest.approx(1.25)] and out.weights.tolist() == [0.25, 0.25, 0.5, 0, 0]


def test_bulyan_by_hand():
    points = np.array([[0], [1], [2], [3], [4], [100], [200]], dtype=np.float64)
    keep = agg.bulyan_select(agg.sq_distances(agg.gram(points)), 1, 5)
    assert keep.tolist() == [0, 1, 2, 3, 4]
    values, used = agg.bulyan_coordinates(points[keep], 1)     # beta = 3 values closest to the median 2
    assert values.tolist() == [2.0] and used.tolist() == [0, 1, 1, 1, 0]
    out = run_rule("bulyan", points, f=1)
    assert out.update.tolist() == [2.0] and out.weights.tolist() == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3, 0, 0, 0])


def test_geometric_median_one_weiszfeld_step_by_hand_and_convergence():
    points = [[0.0], [1.0], [10.0]]
    z0 = 11 / 3
    b = np.array([1 / z0, 1 / (z0 - 1), 1 / (10 - z0)])
    z1 = (b[1] * 1 + b[2] * 10) / b.sum()
    assert run_rule("geomed", points, iterations=1).update[0] == pytest.approx(z1, rel=1e-12)
    assert run_rule("geomed", points, iterations=200).update[0] == pytest.approx(1.0, abs=1e-3)   # the 1-D median


def test_centered_clip_and_norm_bound_by_hand():
    rows = [[3.0, 4.0], [0.0, 0.5]]        # norms 5 and 0.5; radius 1: factors 1/5 and 1
    cc = run_rule("centered_clip", rows, iterations=1, tau=1.0)
    assert cc.update.tolist() == pytest.approx([0.3, 0.65])
    nb = run_rule("norm_bound", rows, bound=1.0)
    assert nb.update.tolist() == pytest.approx([0.3, 0.65]) and nb.weights.tolist() == pytest.approx([0.2, 1.0])
    # Two clipping iterations move the centre on: v2 = v1 + sum_i p_i (u_i - v1) min(1, 1 / ||u_i - v1||).
    v1 = np.array([0.3, 0.65])
    step = sum(0.5 * (np.array(u) - v1) * min(1, 1 / np.linalg.norm(np.array(u) - v1)) for u in rows)
    assert run_rule("centered_clip", rows, iterations=2, tau=1.0).update.tolist() == pytest.approx(list(v1 + step))


def test_fltrust_by_hand():
    coef, trust = agg.fltrust_coefficients(dots=[2, 0, -1], sq_norms=[4, 1, 1], server_sq_norm=1)
    assert trust.tolist() == [1, 0, 0] and coef.tolist() == [0.5, 0, 0]       # rescaled to ||g0|| = 1
    out = run_rule("fltrust", [[2.0, 2.0], [3.0, 0.0]], g0=np.array([1.0, 0.0]))
    s = 1 / math.sqrt(2)
    assert out.update.tolist() == pytest.approx([(s * s + 1) / (1 + s), s * s / (1 + s)])
    assert out.weights.tolist() == pytest.approx([s / (1 + s), 1 / (1 + s)])


# -- limits that are FedAvg --------------------------------------------------------------------------------

def test_limits_equal_the_weighted_mean():
    g = np.random.default_rng(0)
    rows = g.normal(size=(6, 11)).astype(np.float32)
    w = np.array([3, 1, 4, 1, 5, 9], dtype=np.float64)
    fedavg = (w[:, None] * rows.astype(np.float64)).sum(axis=0) / w.sum()
    same = np.repeat(rows[:1], 5, axis=0)
    assert np.array_equal(run_rule("median", same).update, rows[0].astype(np.float64))
    assert run_rule("trimmed_mean", rows, beta=0.0).update == pytest.approx(rows.astype(np.float64).mean(axis=0))
    assert run_rule("multi_krum", rows, w, f=0, m=6).update == pytest.approx(fedavg, rel=1e-12)
    assert run_rule("mean", rows, w).update == pytest.approx(fedavg, rel=1e-12)
    assert run_rule("norm_bound", rows, w, bound=1e9).update == pytest.approx(fedavg, rel=1e-12)
    assert run_rule("centered_clip", rows, w, tau=1e9).update == pytest.approx(fedavg, rel=1e-12)
    assert run_rule("bulyan", rows, f=0).update == pytest.approx(rows.astype(np.float64).mean(axis=0), rel=1e-12)


KEYS = {"krum": {"f": 1}, "multi_krum": {"f": 1, "m": 3}, "bulyan": {"f": 1}, "trimmed_mean": {"beta": 0.2},
        "geomed": {"iterations": 4}, "centered_clip": {"iterations": 3, "tau": 0.5}, "norm_bound": {"bound": 0.7}}


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("attack", [None, "alie", "ipm", "min_max", "min_sum"])
def test_chunked_equals_unchunked(name, attack):
    """Any chunk width gives the same bits: sums over coordinates run block by block on a fixed grid."""
    g = np.random.default_rng(1)
    rows = g.normal(size=(7, 37)).astype(np.float32)
    w = g.integers(1, 9, size=7).astype(np.float64)
    g0 = g.normal(size=37)
    malicious = np.array([0, 1, 0, 0, 1, 0, 0], dtype=bool)

    def make():
        return OmniscientAttack(AttackConfig(name=attack), malicious, 4) if attack else None

    one = run_rule(name, rows, w, block=4, width=40, attack=make(), g0=g0, **KEYS.get(name, {}))
    many = run_rule(name, rows, w, block=4, width=8, attack=make(), g0=g0, **KEYS.get(name, {}))
    assert np.array_equal(one.update, many.update) and np.array_equal(one.weights, many.weights)
    assert len(chunk_bounds(37, 8)) == 5


def test_small_rounds_lower_f_and_the_trim():
    assert krum_f(2, 7) == 2 and krum_f(2, 6) == 1 and krum_f(3, 2) == 0
    assert bulyan_f(2, 11) == 2 and bulyan_f(2, 10) == 1
    # Two clients with Krum f = 3 (a round of few counted clients) still aggregate: the lower id wins the tie.
    assert run_rule("krum", [[1.0], [5.0]], f=3).update.tolist() == [1.0]
    assert run_rule("trimmed_mean", [[1.0], [5.0]], beta=0.4).update.tolist() == [3.0]


def test_chunk_width_follows_the_budget():
    assert chunk_width(10 * 100 * 4096 * BYTES_PER_ENTRY, 100, 10 ** 6) == 10 * 4096
    assert chunk_width(1, 100, 10 ** 6) == 4096              # at least one block
    assert chunk_width(10 ** 15, 100, 5000) == 5000          # at most the whole vector


def test_detection_figures():
    got = detection(excluded=[1, 1, 0, 0, 1], malicious=[1, 0, 0, 0, 1])
    assert got == {"detect_precision": 2 / 3, "detect_recall": 1.0, "honest_excluded": 1 / 3}
    assert all(math.isnan(v) for v in detection([], []).values())


# -- the omniscient attacks --------------------------------------------------------------------------------

def craft(name, rows, malicious, **keys):
    rows = np.asarray(rows, dtype=np.float32).copy()
    attack = OmniscientAttack(AttackConfig(name=name, **keys), np.asarray(malicious, dtype=bool), 4)
    attack.prepare(lambda visit: visit(0, rows.shape[1], rows))
    attack.craft(0, rows.shape[1], rows)
    return rows, attack


def test_alie_and_ipm_by_hand():
    rows, _ = craft("alie", [[1.0, 0.0], [3.0, 4.0], [9.0, 9.0]], [0, 0, 1], z=1.0)
    assert rows[2].tolist() == pytest.approx([2 - math.sqrt(2), 2 - math.sqrt(8)])     # mu - z sigma (ddof 1)
    rows, _ = craft("ipm", [[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]], [0, 0, 1], epsilon=0.5)
    assert rows[2].tolist() == [-1.0, -1.5]
    assert z_max(10, 2) == pytest.approx(0.2533471, abs=1e-6)       # Phi^-1(0.6): s = 6 - 2, (10 - 4) / 10
    _, attack = craft("alie", [[1.0], [2.0]], [0, 1])
    assert attack.z == z_max(2, 1)


def test_min_max_and_min_sum_by_hand():
    # Benign 0 and 2: mu 1, sigma sqrt(2); the farthest benign pair is 2 apart, so gamma = 1 / sqrt(2) puts
    # the malicious update at 0 for both conditions.
    for name in ("min_max", "min_sum"):
        rows, attack = craft(name, [[0.0], [2.0], [7.0]], [0, 0, 1])
        assert attack.gamma == pytest.approx(1 / math.sqrt(2)) and rows[2, 0] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("perturbation", ["std", "unit", "sign"])
def test_min_max_and_min_sum_meet_their_bound(perturbation):
    g = np.random.default_rng(2)
    benign = g.normal(size=(6, 13))
    rows = np.vstack([benign, np.zeros((2, 13))]).astype(np.float32)
    mal = [0] * 6 + [1, 1]
    b = rows[:6].astype(np.float64)
    pair = ((b[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
    out, attack = craft("min_max", rows, mal, perturbation=perturbation)
    far = ((out[6].astype(np.float64) - b) ** 2).sum(axis=1).max()
    assert attack.gamma > 0 and far == pytest.approx(pair.max(), rel=1e-5)
    for bound, limit in (("min", pair.sum(axis=1).min()), ("max", pair.sum(axis=1).max())):
        out, attack = craft("min_sum", rows, mal, perturbation=perturbation, sum_bound=bound)
        total = ((out[6].astype(np.float64) - b) ** 2).sum()
        assert attack.gamma > 0 and total == pytest.approx(limit, rel=1e-5)
    assert largest_gamma("min_max", np.zeros(0), np.zeros(0), 1.0, np.zeros((0, 0))) == 0.0


# -- the config's refusals (exit 2, naming the key) ---------------------------------------------------------

@pytest.mark.parametrize("server, key", [
    ({"aggregator": "krum", "clients_per_round": 6, "robust": {"f": 2}}, "server.robust.f"),
    ({"aggregator": "multi_krum", "clients_per_round": 6, "robust": {"f": 1, "m": 6}}, "server.robust.m"),
    ({"aggregator": "bulyan", "clients_per_round": 6, "robust": {"f": 1}}, "server.robust.f"),
    ({"aggregator": "trimmed_mean", "robust": {"beta": 0.5}}, "server.robust.beta"),
    ({"aggregator": "median", "robust": {"tau": 2.0}}, "server.robust.tau"),
    ({"aggregator": "medain"}, "server.aggregator"),
])
def test_bad_robust_keys_are_refused(server, key):
    with pytest.raises(ConfigError) as e:
        config.from_dict({"partition": {"clients": 20}, "server": server})
    assert key in str(e.value)


@pytest.mark.parametrize("changes, key", [
    ({"server": {"clients_per_round": 5, "aggregator": "fltrust"}}, "server_data.size"),
    ({"server": {"clients_per_round": 5, "aggregator": "median"}, "algorithm": {"name": "scaffold"}},
     "algorithm.name = 'scaffold'"),
    ({"attack": {"name": "alie"}, "algorithm": {"name": "feddyn"}}, "attack.name"),
    ({"server": {"clients_per_round": 5, "aggregator": "median"}, "eval": {"client_drift": True}},
     "eval.client_drift"),
])
def test_set_up_refusals_exit_2_before_any_file(tmp_path, capsys, changes, key):
    out = tmp_path / "run"
    path = write_config(tmp_path / "c.yaml", small_config(out, **changes))
    assert main(["run", str(path)]) == 2
    assert key in capsys.readouterr().err
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == [".fedmpi.lock"]     # no run file


# -- the chunked gather in a run (-n 1, in process) --------------------------------------------------------

def final_model(out):
    import h5py

    with h5py.File(out / "run.h5", "r", locking=False) as f:
        return f["model/global"][()], {k: f[f"metrics/{k}"][()] for k in f["metrics"]}, \
            {k: f[f"clients/{k}"][()] for k in f["clients"]}


def test_gathered_mean_and_norm_bound_equal_their_plain_reduction(tmp_path):
    """An omniscient attack without malicious clients sends the round through the gather, which must then
    give what the plain reduction gives: the mean, and norm_bound (clipped on the clients there)."""
    runs = {}
    for name, server, attack in [
            ("reduce", {}, {}), ("gather", {}, {"name": "ipm", "fraction": 0.0}),
            ("clip_reduce", {"aggregator": "norm_bound", "robust": {"bound": 0.05}}, {}),
            ("clip_gather", {"aggregator": "norm_bound", "robust": {"bound": 0.05}}, {"name": "ipm", "fraction": 0.0})]:
        out = tmp_path / name
        cfg = small_config(out, server={"clients_per_round": 5, **server}, attack=attack or {"name": "none"},
                           runtime={"threads": 1, "progress": "off", "gather_memory": 1})
        assert main(["run", str(write_config(tmp_path / f"{name}.yaml", cfg))]) == 0
        runs[name] = final_model(out)
    assert np.allclose(runs["reduce"][0], runs["gather"][0], rtol=1e-5, atol=1e-7)
    assert np.allclose(runs["clip_reduce"][0], runs["clip_gather"][0], rtol=1e-5, atol=1e-7)
    assert not np.allclose(runs["reduce"][0], runs["clip_reduce"][0], rtol=1e-3)     # the bound did clip
    factors = runs["clip_reduce"][2]["robust_weight"]
    assert np.nanmax(factors) <= 1 and np.nanmin(factors) < 1
    assert np.allclose(factors, runs["clip_gather"][2]["robust_weight"], rtol=1e-4, equal_nan=True)


def test_multi_krum_under_min_sum_logs_weights_and_detection(tmp_path):
    """min_sum with Krum: every round logs detection figures and one robust weight per counted client."""
    out = tmp_path / "krum"
    cfg = small_config(out, server={"clients_per_round": 6, "aggregator": "multi_krum", "robust": {"f": 1, "m": 3}},
                       attack={"name": "min_sum", "fraction": 0.25},
                       runtime={"threads": 1, "progress": "off", "gather_memory": 1})
    assert main(["run", str(write_config(tmp_path / "k.yaml", cfg))]) == 0
    _, metrics, clients = final_model(out)
    assert len(metrics["detect_recall"]) == 3 and np.all(metrics["honest_excluded"] <= 1)
    weights = clients["robust_weight"]
    assert np.allclose(np.nansum(weights, axis=1), 1.0) and ((weights > 0).sum(axis=1) == 3).all()


def test_privacy_is_refused_and_dry_run_states_the_bound():
    from fedmpi.algorithms.fedavg import FedAvg
    from fedmpi.round.robust_checks import check_robust
    from fedmpi.round.robust_setup import dry_run_line

    cfg = config.from_dict({"privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0, "clip": 1.0},
                            "server": {"aggregator": "median"}})
    with pytest.raises(ConfigError, match="privacy.mechanism"):
        check_robust(FedAvg, server=cfg.server, attack=cfg.attack, algorithm_name=cfg.algorithm.name,
                     privacy=cfg.privacy, client_drift=cfg.eval.client_drift, server_data=cfg.server_data)
    cfg = config.from_dict({"partition": {"clients": 100}, "runtime": {"gather_memory": "256MB"},
                            "server": {"aggregator": "median", "clients_per_round": 100}})
    # 256 MB / (100 x 4096 x 32 B) = 19 blocks of 4096 a chunk
    line = dry_run_line(cfg.server, cfg.attack.name, cfg.runtime.gather_bytes, 1756426)
    assert "23 chunk(s) of 77824 coordinates" in line and "249.0 MB" in line
    default = config.from_dict({})
    assert dry_run_line(default.server, default.attack.name, default.runtime.gather_bytes, 1756426) == ""


def test_a_rule_at_its_fedavg_limit_composes_with_the_server_optimizer(tmp_path):
    """Multi-Krum with f = 0 and m = n is the weighted mean: under avgm and a decaying server lr it must give
    FedAvg's run (the rule's output is what the optimizer steps with, round after round)."""
    runs = {}
    for name, server in [("fedavg", {}), ("multi_krum", {"aggregator": "multi_krum", "robust": {"f": 0, "m": 5}})]:
        out = tmp_path / name
        cfg = small_config(out, server={"clients_per_round": 5, "optimizer": "avgm", "momentum": 0.5,
                                        "lr_schedule": {"name": "step", "step_rounds": 1, "gamma": 0.5}, **server},
                           runtime={"threads": 1, "progress": "off", "gather_memory": 1})
        assert main(["run", str(write_config(tmp_path / f"{name}.yaml", cfg))]) == 0
        runs[name] = final_model(out)[0]
    assert np.allclose(runs["fedavg"], runs["multi_krum"], rtol=1e-5, atol=1e-7)
