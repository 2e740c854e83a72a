"""`fedmpi sweep` in one process (issue 41): the spec refused as strictly as a run config, its expansion, the
checks before the first experiment, the queue's order, the index, what a new start does with each folder, and
a whole sweep at one process whose runs equal `fedmpi run`'s. Under MPI: tests/test_sweep_mpi.py."""

from __future__ import annotations

import csv
import os

import h5py
import numpy as np
import pytest
import yaml
from conftest import ROOT, write_config

from fedmpi import config
from fedmpi.cli import main
from fedmpi.mpi.group_comm import GroupLocal, HostShare
from fedmpi.sweep import configs, index, schedule, spec, state

TINY = {"seed": 0, "rounds": 2, "out": "unused", "data": {"name": "synthetic"}, "partition": {"clients": 8},
        "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 10}, "server": {"clients_per_round": 3},
        "runtime": {"threads": 1, "progress": "off"}}


@pytest.fixture
def base(tmp_path):
    return write_config(tmp_path / "base.yaml", TINY)


def write_spec(tmp_path, mapping, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(mapping if isinstance(mapping, str) else yaml.safe_dump(mapping, sort_keys=False))
    return path


def refused(capsys, path):
    """The stderr lines of a sweep refused with exit 2 (asserted)."""
    assert main(["sweep", str(path)]) == 2
    return capsys.readouterr().err.splitlines()


# --- the spec, refused as strictly as a run config ---------------------------------------------------------

BASE, OUT = "base.yaml", "out"
BAD = [
    ({"out": OUT, "base": BASE, "seed": 1}, "unknown key 'seed' (did you mean 'seeds'?)"),
    ({"base": BASE}, "out: missing; give the sweep's folder"),
    ({"base": BASE, "out": OUT, "grid": {"client.lr": 0.1}}, "grid.client.lr = 0.1: must be a non-empty list"),
    ({"base": BASE, "out": OUT, "grid": "client.lr"}, "grid = 'client.lr': must be a mapping"),
    ({"base": BASE, "out": OUT, "seeds": [1, 1]}, "seeds = (1, 1): must be a non-empty list of distinct integers"),
    ({"base": BASE, "out": OUT, "seeds": ["a"]}, "seeds = ['a']: must be a list of values, each an integer or null"),
    ({"base": BASE, "out": OUT, "ranks": 0}, "ranks = 0: must be an integer in [1, 1e+06]"),
    ({"base": BASE, "out": OUT, "ranks": "many"}, "ranks = 'many': must be an integer or a mapping"),
    ({"base": BASE, "out": OUT, "ranks": {"clients_per_rank": 2, "mx": 3}},
     "unknown key 'ranks.mx' (did you mean 'max'?)"),
    ({"base": BASE, "out": OUT, "ranks": {"max": 3}}, "ranks.clients_per_rank: missing"),
    ({"base": BASE, "out": OUT, "grid": {"seed": [1]}}, "grid.seed: set by the sweep; list the seeds under `seeds`"),
    ({"base": BASE, "out": OUT, "overrides": {"out": "x"}}, "overrides.out: set by the sweep"),
    ({"base": BASE, "out": OUT, "sets": [{"name": "a"}]}, "sets[0]: changes nothing"),
    ({"base": BASE, "out": OUT, "sets": [3]}, "sets[0] = 3: must be a mapping"),
    ({"base": BASE, "out": OUT, "sets": {"m": "x"}}, "sets.m = 'x': must be a non-empty list of override sets"),
    ({"base": BASE, "out": OUT, "sets": [{"name": 4, "client.lr": 0.1}]},
     "sets[0].name = 4: must be a non-empty string"),
    ({"out": OUT, "grid": {"client.lr": [0.1]}}, "base: missing"),
    ({"base": BASE, "out": OUT, "grid": {"client.lr": [0.1]}, "overrides": {"client.lr": 0.2}},
     "grid.client.lr: also in overrides"),
    ({"base": BASE, "out": OUT, "grid": {"client.lr": [0.1]}, "sets": [{"client.lr": 0.2}]},
     "sets: client.lr is also a grid key"),
    ({"base": BASE, "out": OUT, "sets": {"a": [{"client.lr": 0.1}], "b": [{"client.lr": 0.2}]}},
     "sets: client.lr is set by two lists of sets"),
    ({"base": BASE, "out": OUT, "sets": [{"name": "a", "client.lr": 0.1}, {"name": "a", "client.lr": 0.2}]},
     "experiments share the folder name 'a'"),
    ({"base": BASE, "out": OUT, "sets": [{"name": "index.csv", "client.lr": 0.1}]}, "the sweep's index"),
    ("- 1\n- 2\n", "top level must be a mapping of keys"),
    ("out: a\nout: b\n", "'out'"),
]


@pytest.mark.parametrize("mapping,problem", BAD, ids=[p for _, p in BAD])
def test_a_bad_spec_is_refused_with_one_line_naming_the_key(tmp_path, base, capsys, mapping, problem):
    path = write_spec(tmp_path, mapping)
    lines = refused(capsys, path)
    assert len(lines) == 1 and lines[0].startswith("fedmpi: config error: sweep spec") and problem in lines[0], lines
    assert not (tmp_path / OUT).exists()


def test_every_problem_of_a_spec_is_reported_at_once(tmp_path, base, capsys):
    path = write_spec(tmp_path, {"base": BASE, "out": OUT, "sed": 1, "grid": {"client.lr": 0.1}, "ranks": 0})
    assert len(refused(capsys, path)) == 3


def test_a_missing_spec_or_base_is_named(tmp_path, capsys):
    assert "not found" in refused(capsys, tmp_path / "nowhere.yaml")[0]
    path = write_spec(tmp_path, {"base": "nowhere.yaml", "out": OUT, "seeds": [0, 1]})
    (line,) = refused(capsys, path)
    assert line.startswith("fedmpi: config error: 2 experiments (seed-0, seed-1): config file") and "not found" in line


# --- expansion ------------------------------------------------------------------------------------------------

def test_the_product_of_sets_grid_and_seeds_in_order_with_names(tmp_path, base):
    path = write_spec(tmp_path, {"base": BASE, "out": OUT, "overrides": {"rounds": 3},
                                 "sets": {"m": [{"name": "avg", "algorithm.name": "fedavg"},
                                                {"algorithm.name": "fedprox", "algorithm.mu": 0.1}],
                                          "s": [{"name": "small", "server.clients_per_round": 2}]},
                                 "grid": {"client.lr": [0.1, 0.2]}, "seeds": [3, 4]})
    s = spec.load(path)
    names = [e.name for e in s.experiments]
    assert len(names) == 2 * 1 * 2 * 2 == len(set(names))
    assert names[:3] == ["avg_small_client.lr-0.1_seed-3", "avg_small_client.lr-0.1_seed-4",
                         "avg_small_client.lr-0.2_seed-3"]
    assert names[4] == "algorithm.name-fedprox_algorithm.mu-0.1_small_client.lr-0.1_seed-3"
    e = s.experiments[4]
    assert e.overrides == {"rounds": 3, "algorithm.name": "fedprox", "algorithm.mu": 0.1,
                           "server.clients_per_round": 2, "client.lr": 0.1, "seed": 3}
    assert e.labels == {"m": "algorithm.name-fedprox_algorithm.mu-0.1", "s": "small"}    # each axis's set
    built = configs.build(s)[4]
    expected = config.load(base, ["rounds=3", "algorithm.name=fedprox", "algorithm.mu=0.1",
                                  "server.clients_per_round=2", "client.lr=0.1", "seed=3",
                                  f"out={os.path.join(OUT, e.name)}"])
    assert built == expected


def test_the_benchmark_grid_is_24_quickstart_experiments():
    s = spec.load(ROOT / "jobs" / "sweeps" / "quickstart_grid.yaml")
    built = configs.build(s)
    settings = {tuple(sorted((k, v) for k, v in e.overrides.items() if k != "seed")) for e in s.experiments}
    assert len(s.experiments) == 24 and len(settings) == 8
    assert {c.seed for c in built} == {0, 1, 2} and {c.data.name for c in built} == {"mnist5k"}


@pytest.mark.parametrize("path", sorted((ROOT / "jobs" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_every_spec_in_jobs_builds(path):
    s = spec.load(path)
    built = configs.build(s)
    assert len(built) == len(s.experiments) > 1 and s.out.startswith("runs/")


def test_experiment_problems_are_reported_at_once_naming_the_experiments(tmp_path, base, capsys):
    path = write_spec(tmp_path, {"base": BASE, "out": OUT, "grid": {"client.lr": [-1, 0.1]},
                                 "sets": [{"name": "x", "algorithm.nu": 1}, {"name": "y", "client.epochs": 1}]})
    lines = refused(capsys, path)
    assert lines == [
        "fedmpi: config error: 2 experiments (x_client.lr--1, y_client.lr--1): client.lr = -1.0: must be a number "
        "in (0, 1e+06]",
        "fedmpi: config error: 2 experiments (x_client.lr--1, x_client.lr-0.1): unknown key 'algorithm.nu'; "
        "known keys: name"]
    assert not (tmp_path / OUT).exists()


def test_ranks_from_the_experiments_size_and_its_data_key(tmp_path, base):
    rule = spec.RanksRule(clients_per_rank=4)
    s = spec.Spec("x", "o", rule, ())
    cfg = config.from_dict({**TINY, "server": {"clients_per_round": 10}, "partition": {"clients": 10}})
    assert configs.ranks(s, cfg, 9) == 1 + 3 and configs.ranks(s, cfg, 2) == 2
    assert configs.ranks(spec.Spec("x", "o", spec.RanksRule(4, max=3), ()), cfg, 9) == 3
    other_seed = config.from_dict({**TINY, "seed": 1})
    assert configs.data_key(config.from_dict(TINY)) != configs.data_key(other_seed)     # synthetic: per seed
    mnist = {**TINY, "data": {"name": "mnist5k"}}
    assert configs.data_key(config.from_dict(mnist)) == configs.data_key(config.from_dict({**mnist, "seed": 1}))


# --- the queue, the index and the folders ------------------------------------------------------------------

def test_the_queue_takes_the_largest_first_and_fills_free_ranks_with_smaller_ones():
    rows = [index.Row(f"e{i}") for i in range(4)]
    book = schedule.Schedule("unused", rows, ranks=[1, 2, 2, 1], sizes=[5.0, 1.0, 3.0, 9.0], modes=[0] * 4,
                             workers=3, say=lambda text: None)
    assert book.queue == [2, 1, 3, 0]
    nodes = {r: 0 for r in range(1, 4)}
    assert book.pick({1, 2, 3}, nodes) == (2, [1, 2])
    assert book.pick({3}, nodes) == (3, [3])         # e2 and e1 need two: the free rank takes e3


def test_a_group_lands_on_as_few_nodes_as_possible():
    nodes = {1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    assert schedule.pick_ranks(nodes, 2, nodes) == [1, 2]          # the fullest fit: node 0
    assert schedule.pick_ranks(nodes, 3, nodes) == [3, 4, 5]
    assert schedule.pick_ranks(nodes, 4, nodes) == [1, 3, 4, 5]    # node 1 whole, then node 0


def test_the_time_left_from_the_finished_experiments_rate():
    rows = [index.Row(f"e{i}") for i in range(3)]
    book = schedule.Schedule("unused", rows, [1, 1, 1], [5.0, 5.0, 10.0], [0] * 3, workers=2, say=lambda t: None)
    book.queue = [1, 2]
    book.finished_work = [(10.0, 5.0)]          # 10 rank-seconds for size 5: 2 rank-seconds per unit
    assert book.time_left() == "about 15 s left"    # (5 + 10) * 2 / 2 ranks


@pytest.mark.parametrize("code,run_status,status", [
    (0, "finished", "finished"), (75, "preempted", "preempted"), (130, "interrupted", "interrupted"),
    (2, "", "refused"), (1, "diverged", "diverged"), (1, "failed", "failed"), (1, "", "failed")])
def test_the_index_status_of_an_exit(code, run_status, status):
    assert schedule.status_of(code, run_status) == status


def test_the_index_is_replaced_whole_and_reads_back(tmp_path):
    rows = [index.Row("a", status="failed", wall_s=1.5, message="two\nlines"), index.Row("b", ranks=3)]
    index.write(tmp_path, rows)
    assert os.listdir(tmp_path) == ["index.csv"]           # no temporary file left
    back = index.read(tmp_path)
    assert back["a"].message == "two lines" and back["a"].wall_s == 1.5 and back["b"].ranks == 3
    with open(tmp_path / "index.csv", newline="") as fh:
        assert tuple(next(csv.reader(fh))) == index.COLUMNS


def _fake_run(out, cfg, status, rounds, checkpoints=()):
    os.makedirs(out, exist_ok=True)
    with h5py.File(os.path.join(out, "run.h5"), "w") as f:
        f.attrs["status"], f.attrs["config_hash"] = status, cfg.hash()
        f["metrics/round"] = np.arange(rounds)
    for r in checkpoints:
        os.makedirs(os.path.join(out, "ckpt"), exist_ok=True)
        open(os.path.join(out, "ckpt", f"ckpt-{r}.h5"), "wb").close()


@pytest.mark.parametrize("status,rounds,checkpoints,retry,found", [
    (None, 0, (), False, ("pending", state.FRESH)),
    (None, 0, (2,), False, ("pending", state.OVERWRITE)),
    ("finished", 2, (), False, ("finished", state.FRESH)),
    ("finished", 1, (), False, ("pending", state.OVERWRITE)),        # fewer rounds than asked, no checkpoint
    ("preempted", 1, (1,), False, ("pending", state.RESUME)),
    ("running", 1, (), False, ("pending", state.OVERWRITE)),
    ("failed", 1, (1,), False, ("failed", state.FRESH)),
    ("failed", 1, (1,), True, ("pending", state.RESUME)),
    ("diverged", 1, (), False, ("diverged", state.FRESH))])
def test_what_a_new_start_does_with_each_folder(tmp_path, status, rounds, checkpoints, retry, found):
    cfg = config.from_dict({**TINY, "out": str(tmp_path / "e")})
    if status:
        _fake_run(cfg.out, cfg, status, rounds, checkpoints)
    elif checkpoints:
        _fake_run(cfg.out, cfg, "x", 0, checkpoints)
        os.remove(os.path.join(cfg.out, "run.h5"))
    got = state.assess(cfg, retry)
    assert (got.status, got.mode) == found and not got.problem


def test_a_folder_holding_another_configs_run_refuses(tmp_path):
    cfg = config.from_dict({**TINY, "out": str(tmp_path / "e")})
    _fake_run(cfg.out, config.from_dict({**TINY, "seed": 5}), "finished", 2)
    assert "holds a run of another config" in state.assess(cfg).problem
    _fake_run(cfg.out, cfg, "finished", 3)
    assert "rounds may grow, not shrink" in state.assess(cfg).problem


def test_a_group_takes_its_share_of_the_nodes_cores():
    host = HostShare(cores=8, computing=4, device_rank=3)
    assert [host.cores_for(k) for k in (1, 2, 4)] == [2, 4, 8]
    assert HostShare(1, 4, 0).cores_for(1) == 1
    node = GroupLocal(host).node_local(gpus=2)
    assert (node.local_rank, node.cores, node.server_node_gpus) == (3, 2, 2)


# --- a whole sweep in one process ---------------------------------------------------------------------------

def test_a_sweep_in_one_process_equals_fedmpi_run_and_a_new_start_keeps_it(tmp_path, base, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_spec(tmp_path, {"base": BASE, "out": OUT, "grid": {"algorithm.name": ["fedavg", "fedprox"]},
                                 "seeds": [0, 1], "ranks": 2})
    assert main(["sweep", str(path)]) == 0
    err = capsys.readouterr().err
    assert "4 experiments in out (4 to run, 0 kept from earlier launches) in one process, each at -n 1" in err
    assert err.count("fedmpi sweep: started ") == 4 and err.count("fedmpi sweep: finished ") == 4
    rows = index.read(tmp_path / OUT)
    assert {r.status for r in rows.values()} == {"finished"} and {r.ranks for r in rows.values()} == {1}
    assert main(["run", str(base), "algorithm.name=fedprox", "seed=1", "out=alone"]) == 0
    with h5py.File(tmp_path / OUT / "algorithm.name-fedprox_seed-1" / "run.h5", "r") as a, \
            h5py.File(tmp_path / "alone" / "run.h5", "r") as b:
        assert np.array_equal(a["model/global"][()], b["model/global"][()])
        assert np.array_equal(a["metrics/model_sha256"][()], b["metrics/model_sha256"][()])
    capsys.readouterr()
    assert main(["sweep", str(path)]) == 0
    assert "(0 to run, 4 kept from earlier launches)" in capsys.readouterr().err
    assert {r.attempts for r in index.read(tmp_path / OUT).values()} == {1}


def test_a_config_the_data_or_model_refuses_stops_the_sweep_before_it_starts(tmp_path, base, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_spec(tmp_path, {"base": BASE, "out": OUT,
                                 "sets": [{"model.name": "cnn_mnist"}, {"model.name": "mlp"}]})
    (line,) = refused(capsys, path)
    assert line.startswith("fedmpi: config error: experiment model.name-cnn_mnist: model.name = 'cnn_mnist': needs "
                           "image data")
    assert not (tmp_path / OUT).exists()          # no folder, lock or index left behind


def test_a_dry_run_lists_the_experiments_in_their_order_and_touches_nothing(tmp_path, base, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_spec(tmp_path, {"base": BASE, "out": OUT, "ranks": {"clients_per_rank": 2},
                                 "sets": [{"name": "few", "server.clients_per_round": 2},
                                          {"name": "many", "server.clients_per_round": 6}]})
    assert main(["sweep", str(path), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == ["many: 4 rank(s), new", "few: 2 rank(s), new"]
    assert not (tmp_path / OUT).exists()


def test_run_batch_keeps_the_stop_signals_for_every_run(tmp_path, monkeypatch):
    """Each run ends by ignoring signals (fedmpi.run.launch); a batch keeps the handlers for its later runs, as a
    sweep does (signals.keep_handlers), so that a SIGTERM in its second run still checkpoints it."""
    import importlib.util
    import signal

    import fedmpi.run.launch as launch
    from fedmpi.mpi import signals

    seen = []

    def fake_run(cfg, comm, **kwargs):
        seen.append(signal.getsignal(signal.SIGTERM))
        signals.ignore_all()            # what every run does when it ends
        return 0

    monkeypatch.setattr(launch, "run_experiment", fake_run)
    spec = importlib.util.spec_from_file_location("run_batch_tool", ROOT / "tools" / "run_batch.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    paths = [str(write_config(tmp_path / f"c{i}.yaml", TINY)) for i in range(2)]
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        assert tool.main([*paths, "--out-root", str(tmp_path / "runs")]) == 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert seen == [signals._handler, signals._handler]


def test_a_stopped_sweep_experiment_says_how_to_continue_the_sweep(monkeypatch):
    """Smaller item d: an experiment stopped inside a sweep said "continue with --resume", an option `fedmpi sweep`
    does not have; the same spec started again continues it (docs/how-to/sweeps.md), and the line says that. A plain
    run (and tools/run_batch.py's runs, which are `fedmpi run`s) still names --resume."""
    from fedmpi.core.errors import StopRequested
    from fedmpi.mpi import signals
    from fedmpi.sweep import command

    assert signals.stop_error(3).args[0].endswith("continue with --resume")
    with signals.keep_handlers():
        assert signals.stop_error(3).args[0].endswith("continue with --resume")

    def stopped(*args):
        raise signals.stop_error(3)

    monkeypatch.setattr(command.spec_mod, "load", lambda path: object())
    monkeypatch.setattr(command.configs_mod, "build", lambda spec: [])
    monkeypatch.setattr(command.signals, "install", lambda: None)
    monkeypatch.setattr(command, "_sweep", stopped)
    with pytest.raises(StopRequested) as e:
        command.sweep_command("jobs/sweeps/my grid.yaml")
    line = str(e.value)
    assert "--resume" not in line and "fedmpi sweep 'jobs/sweeps/my grid.yaml'" in line, line
    assert "after round 3 with a checkpoint; continue by starting the same sweep again" in line, line
    assert signals.stop_error(3).args[0].endswith("continue with --resume")       # the sweep's block has ended
