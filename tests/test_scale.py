"""Issue 14 in one process: the client-state store (memory bound, spill files, round cache), per-client rows
in run.h5 and their [round, client] reader, the node-shared data's fill rules, the per-rank evaluation
batches, the memory estimate, the out-of-memory message and runtime.deterministic. The MPI side (pretend
nodes, shared windows, -n invariance and resume with spilled state) is in test_scale_mpi.py."""

from __future__ import annotations

import math
import os

import h5py
import numpy as np
import pytest
import torch
from dataset_files import emnist_names, write_mnist_family

import fedmpi
from fedmpi import config
from fedmpi.algorithms.state import ClientStateStore, ClientVectors, SpillFile
from fedmpi.core.errors import ConfigError
from fedmpi.data import load_dataset, sources
from fedmpi.data.dataset import from_arrays
from fedmpi.io.store import CORE_METRICS, RunLog, client_row, client_table, read_clients
from fedmpi.mpi.local import LocalComm
from fedmpi.mpi.runtime import parse_bytes
from fedmpi.mpi.shared_arrays import SHARED_ALIGN, shared_layout
from fedmpi.mpi.topology import share_of


def synthetic_cfg(**sections):
    base = {"seed": 3, "rounds": 4, "data": {"name": "synthetic"},
            "partition": {"clients": 40, "scheme": "natural", "samples_per_client": 12},
            "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 6}, "server": {"clients_per_round": 8},
            "eval": {"every": 2}, "runtime": {"threads": 1, "progress": "off"}}
    base.update(sections)
    return config.from_dict(base)


# -- the client-state store -------------------------------------------------------------------------------

def test_store_keeps_vectors_in_memory_up_to_its_budget_and_spills_the_rest():
    store = ClientStateStore(budget=3 * 40, folder=None)     # three vectors of 10 float32
    vectors = {cid: np.arange(10, dtype=np.float32) + 100 * cid for cid in range(70)}
    for cid, vec in vectors.items():
        store.put(("c", cid), vec)
    assert store.memory_bytes == 120 and len(store.memory) == 3 and len(store.spilled) == 67
    assert store.spilled_bytes == 67 * 40
    for cid, vec in vectors.items():
        assert np.array_equal(store.get(("c", cid)), vec)
    spill = store.files[(10, np.dtype(np.float32).str)]
    assert os.fstat(spill.file.fileno()).st_size == 67 * 40
    freed = store.spilled[("c", 50)][1]
    store.drop(("c", 50))
    store.put(("c", 99), np.full(10, 7, dtype=np.float32))   # reuses the freed row
    assert store.spilled[("c", 99)][1] == freed
    assert np.array_equal(store.get(("c", 99)), np.full(10, 7, dtype=np.float32)) and store.get(("c", 50)) is None
    assert spill.used == 67 and not spill.free


def test_a_spilled_vector_is_rewritten_in_place_and_a_memory_one_is_replaced():
    store = ClientStateStore(budget=40)
    store.put(("v", 0), np.zeros(10, np.float32))          # in memory
    store.put(("v", 1), np.zeros(10, np.float32))          # spilled
    held = store.get(("v", 0))
    store.put(("v", 0), np.ones(10, np.float32))
    assert held.sum() == 0 and store.get(("v", 0)).sum() == 10   # a view handed out keeps the old values
    row = store.spilled[("v", 1)][1]
    store.put(("v", 1), np.full(10, 2, np.float32))
    assert store.spilled[("v", 1)][1] == row and store.get(("v", 1)).sum() == 20


def test_spill_file_lives_in_the_folder_asked_for_and_leaves_no_name(tmp_path):
    spill = SpillFile(5, np.float64, tmp_path)
    rows = [spill.take(), spill.take()]
    spill.write(rows[1], np.arange(5))
    spill.write(rows[0], -np.arange(5))
    assert list(tmp_path.iterdir()) == []       # unlinked at creation: it goes with the process
    read = spill.read(rows[1])
    assert read.tolist() == [0, 1, 2, 3, 4] and read.flags.writeable and read.dtype == np.float64
    assert spill.read(rows[0]).tolist() == [0, -1, -2, -3, -4]


def test_client_vectors_keep_the_rounds_vectors_on_the_device_until_end_round():
    store = ClientStateStore()
    vectors = ClientVectors("c_i", store)
    assert vectors.get(3) is None and len(vectors) == 0
    vectors[3] = torch.ones(4)
    assert store.get(("c_i", 3)) is None               # not written back before the round ends
    assert torch.equal(vectors.on(3, torch.device("cpu")), torch.ones(4)) and 3 in vectors
    store.end_round()
    assert np.array_equal(store.get(("c_i", 3)), np.ones(4, np.float32)) and not vectors._round
    assert torch.equal(vectors[3], torch.ones(4)) and list(vectors) == [3]
    assert vectors.state(3)["c_i"].tolist() == [1.0] * 4
    spilling = ClientVectors("z", ClientStateStore(budget=0))
    spilling[1] = torch.arange(3.0)
    spilling.end_round()
    assert 1 in spilling and 2 not in spilling and not spilling._round
    assert spilling.state(1)["z"].tolist() == [0, 1, 2] and not spilling._round   # a checkpoint keeps no copy
    spilling.get(1).add_(1)                                  # changed in place during a round (as MOON does)
    spilling.end_round()
    assert spilling.state(1)["z"].tolist() == [1, 2, 3]
    other = ClientVectors("c_i")
    other.load(5, {"c_i": np.full(4, 2.0)})
    other.load(6, {})
    assert list(other) == [5] and other.or_zeros(6, 4, torch.device("cpu")).sum() == 0
    other.bind(store)
    assert sorted(vectors) == [3, 5] and torch.equal(vectors[5], torch.full((4,), 2.0))
    del vectors[3]
    assert sorted(other) == [5] and store.get(("c_i", 3)) is None


@pytest.mark.parametrize("algorithm", [{"name": "scaffold"}, {"name": "feddyn"}, {"name": "moon", "mu": 1.0}])
def test_spilled_client_state_gives_the_same_run(algorithm):
    model = {"name": "simple_cnn", "projection": 8} if algorithm["name"] == "moon" else {"name": "lr"}
    data = {"data": {"name": "mnist5k"}, "partition": {"clients": 10, "scheme": "iid"}} \
        if algorithm["name"] == "moon" else {}
    cfg = synthetic_cfg(algorithm=algorithm, model=model, **data)
    plain = fedmpi.simulate(cfg, rounds=3)
    bounded = fedmpi.simulate(cfg, rounds=3, **{"runtime.client_state_memory": "1kB"})
    store = bounded.experiment.client_store
    assert store.spilled and store.memory_bytes <= 1000
    assert np.array_equal(plain.model, bounded.model)
    assert list(plain.metrics["model_sha256"]) == list(bounded.metrics["model_sha256"])
    assert not plain.experiment.client_store.spilled


def test_compression_residuals_live_in_the_same_store():
    cfg = synthetic_cfg(client={"lr": 0.05, "batch_size": 6,
                                "compress": {"name": "topk", "fraction": 0.1, "error_feedback": True}})
    plain = fedmpi.simulate(cfg, rounds=3)
    bounded = fedmpi.simulate(cfg, rounds=3, **{"runtime.client_state_memory": 0})
    store = bounded.experiment.client_store
    assert store.spilled and all(name == "compress_residual" for name, _ in store.spilled)
    assert np.array_equal(plain.model, bounded.model)


def test_client_state_memory_reads_units_and_names_the_key_when_wrong():
    assert parse_bytes("4GB") == 4 * 10 ** 9 and parse_bytes("512MiB") == 512 * 2 ** 20
    assert parse_bytes("1.5 kb") == 1500 and parse_bytes(123) == 123
    assert synthetic_cfg(runtime={"client_state_memory": "2MB"}).runtime.client_state_bytes == 2 * 10 ** 6
    assert synthetic_cfg(runtime={"client_state_memory": 5}).runtime.client_state_bytes == 5
    for bad in ("4 parsecs", "-1", True, [1]):
        with pytest.raises(ConfigError) as info:
            synthetic_cfg(runtime={"client_state_memory": bad})
        assert "runtime.client_state_memory" in str(info.value)
    # A run-time key: it does not change the config's hash, so a resume may change it.
    assert synthetic_cfg().hash() == synthetic_cfg(runtime={"client_state_memory": "1GB"}).hash()


# -- per-client rows in run.h5 ---------------------------------------------------------------------------

def dense_rows(num_clients, selected, arrived=()):
    """A round's dense per-client rows as the server makes them (NaN figures, 0 indicators)."""
    sel = np.zeros(num_clients, np.float32)
    sel[selected] = 1
    loss = np.full(num_clients, np.nan, np.float32)
    loss[selected] = np.arange(len(selected)) + 0.5
    arr = np.zeros(num_clients, np.float32)
    arr[list(arrived)] = 1
    return {"selected": sel, "loss": loss, "arrived": arr}


def test_a_row_names_the_selected_clients_and_any_other_with_a_figure():
    ids, values = client_row(dense_rows(10, [2, 7], arrived=[5]), 10)
    assert ids.tolist() == [2, 5, 7]
    assert values["selected"].tolist() == [1, 0, 1] and values["arrived"].tolist() == [0, 1, 0]
    assert values["loss"][[0, 2]].tolist() == [0.5, 1.5] and np.isnan(values["loss"][1])


def test_run_log_stores_rows_that_grow_with_the_clients_selected_not_with_n(tmp_path):
    rounds = [([3, 1, 8], ()), ([0, 9], (4,)), ([2, 5, 6, 7], ())]
    sizes = {}
    for n in (10, 100_000):
        path = tmp_path / f"n{n}.h5"
        log = RunLog.create(str(path), synthetic_cfg(), 1, ["host"], {})
        written = []
        for selected, arrived in rounds:
            rows = dense_rows(n, sorted(selected), arrived)
            written.append(rows)
            log.append({"round": len(written) - 1}, rows, num_clients=n)
        log.close()
        with h5py.File(path, "r") as f:
            g = f["clients"]
            assert g.attrs["layout"] == "rows" and g.attrs["num_clients"] == n
            sizes[n] = {name: ds.shape for name, ds in g.items()}
            assert g["ids"][0].tolist() == [1, 3, 8, -1] and g["selected"].attrs["fill"] == 0
            assert math.isnan(g["loss"].attrs["fill"])
        dense = read_clients(str(path))
        for name in ("selected", "loss", "arrived"):
            expected = np.stack([w[name] for w in written])
            assert dense[name].shape == (3, n) and np.array_equal(dense[name], expected, equal_nan=True), name
    assert sizes[10] == sizes[100_000] == {name: (3, 4) for name in ("ids", "selected", "loss", "arrived")}


def test_a_truncated_and_rewritten_row_keeps_nothing_of_the_old_one(tmp_path):
    path = tmp_path / "run.h5"
    log = RunLog.create(str(path), synthetic_cfg(), 1, ["host"], {})
    for t, selected in enumerate(([0, 1, 2, 3, 4], [5, 6, 7, 8, 9])):
        log.append({"round": t}, dense_rows(10, selected), num_clients=10)
    log.truncate(1)                                         # a resume from round 1 drops row 1
    log.append({"round": 1}, dense_rows(10, [4, 9]), num_clients=10)
    log.close()
    dense = read_clients(str(path))
    assert np.array_equal(dense["selected"][1], dense_rows(10, [4, 9])["selected"])
    assert np.array_equal(dense["loss"][1], dense_rows(10, [4, 9])["loss"], equal_nan=True)


def test_older_dense_files_read_the_same_and_stay_dense_when_continued(tmp_path):
    path = tmp_path / "old.h5"
    log = RunLog.create(str(path), synthetic_cfg(), 1, ["host"], {})
    log.append({"round": 0})
    log.close()
    old = dense_rows(6, [1, 4])
    with h5py.File(path, "a") as f:                         # the layout before issue 14
        for name, row in old.items():
            f["clients"].create_dataset(name, data=row[None], maxshape=(None, 6), chunks=(64, 6))
    log = RunLog(str(path))
    log.append({"round": 1}, dense_rows(6, [0, 5]), num_clients=6)
    log.close()
    with h5py.File(path, "r") as f:
        assert "ids" not in f["clients"] and f["clients/selected"].shape == (2, 6)
        table = client_table(f)
        assert table.names == ["arrived", "loss", "selected"] and len(table["loss"]) == 2
        assert np.array_equal(table["selected"][1], dense_rows(6, [0, 5])["selected"])
        assert np.array_equal(table.dense("loss")[0], old["loss"], equal_nan=True)


def test_in_process_results_keep_the_dense_view():
    result = fedmpi.simulate(synthetic_cfg(), rounds=2)
    assert result.clients["selected"].shape == (2, 40) and np.all(result.clients["selected"].sum(axis=1) == 8)


# -- the node-shared data ------------------------------------------------------------------------------

def test_shares_cover_every_row_once():
    for n, parts in ((10, 3), (2, 5), (0, 2), (1000, 7)):
        spans = [share_of(n, p, parts) for p in range(parts)]
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert max(hi - lo for lo, hi in spans) - min(hi - lo for lo, hi in spans) <= 1


def test_shared_arrays_start_on_page_boundaries_without_overlap():
    specs = {"a": ((3, 5), np.float32), "b": ((0,), np.int64), "c": ((1025,), np.int32)}
    layout, total = shared_layout(specs)
    offsets = [layout[k][0] for k in specs]
    assert offsets == [0, SHARED_ALIGN, SHARED_ALIGN] and total == 3 * SHARED_ALIGN
    arrays = LocalComm().share_arrays(specs, lambda a, part, parts: [v.fill(part + 1) for v in a.values()])
    assert all(not a.flags.writeable for a in arrays.values()) and arrays["c"].sum() == 1025


def test_every_part_of_a_streamed_source_writes_the_values_of_the_whole_loader(tmp_path):
    write_mnist_family(tmp_path, "EMNIST", n_train=100, n_test=30, classes=62, names=emnist_names("byclass"))
    cases = [synthetic_cfg(),
             config.from_dict({"data": {"name": "emnist", "root": str(tmp_path), "split": "byclass"},
                               "partition": {"clients": 5, "scheme": "iid"}, "server": {"clients_per_round": 2}})]
    for cfg in cases:
        whole = load_dataset(cfg)
        stream = sources.STREAMED[cfg.data.name](cfg.data, cfg.seed, cfg.partition)
        arrays = {name: np.full(shape, -9, dtype=dtype) for name, (shape, dtype) in stream.specs().items()}
        for part in range(3):
            stream.fill(arrays, part, 3)
        parted = from_arrays(cfg.data.name, arrays)
        for name in ("x_train", "y_train", "x_test", "y_test"):
            assert np.array_equal(getattr(whole, name), getattr(parted, name)), (cfg.data.name, name)
        assert parted.num_classes == whole.num_classes
        assert (whole.users is None) == (parted.users is None)


def test_a_part_touches_only_its_rows():
    cfg = synthetic_cfg()
    specs = sources.synthetic_specs(cfg.seed, cfg.partition)
    arrays = {name: np.full(shape, -9, dtype=dtype) for name, (shape, dtype) in specs.items()}
    sources.synthetic_fill(cfg.data, cfg.seed, cfg.partition, arrays, 1, 3)
    for name in ("x_train", "y_train", "x_test", "y_test", "users_index"):
        lo, hi = share_of(len(arrays[name]), 1, 3)
        written = np.flatnonzero((arrays[name] != -9).reshape(len(arrays[name]), -1).any(axis=1))
        assert written.min() == lo and written.max() == hi - 1, name


def test_a_rank_evaluates_and_holds_only_its_test_batches():
    from fedmpi.round.evaluation import SplitEvaluation

    class Rank1of3:
        rank, size, is_server = 1, 3, False

    x = np.arange(23 * 2, dtype=np.float32).reshape(23, 2)
    y = np.arange(23) % 4
    seen = []
    evaluation = SplitEvaluation(Rank1of3(), None, x, y, 5, 4, lambda a: seen.append(a) or torch.from_numpy(a))
    assert evaluation.mine == [1, 4] and [b for b, _, _ in evaluation.my_batches] == [1, 4]
    assert [int(a[0, 0]) for a in seen[::2]] == [10, 40] and len(seen[-1]) == 3    # rows 5..9 and 20..22
    assert evaluation.class_counts.tolist() == [6, 6, 6, 5]


# -- memory: the estimate, running out -------------------------------------------------------------------

def test_dry_run_prints_the_memory_estimate(capsys, tmp_path):
    from fedmpi.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("data: {name: synthetic}\npartition: {clients: 40, scheme: natural, samples_per_client: 12}\n"
                   "model: {name: lr}\nalgorithm: {name: scaffold}\nserver: {clients_per_round: 8}\n")
    assert main(["run", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "memory estimate" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("data "))
    ds = load_dataset(config.load(str(cfg)))
    data_mb = sum(a.nbytes for a in (ds.x_train, ds.y_train, ds.x_test, ds.y_test)) / 1e6
    per_rank_2, node_2 = (float(v) for v in row.split()[1:3])
    assert per_rank_2 == pytest.approx(data_mb / 2, abs=0.05) and node_2 == pytest.approx(data_mb, abs=0.05)
    state = next(line for line in out.splitlines() if "client state in memory" in line).split()
    # SCAFFOLD: one vector of 610 float32 per client; at -n 2 the one worker hosts all 40 clients.
    assert float(state[4]) == pytest.approx(40 * 610 * 4 / 1e6, abs=0.05)


def test_a_rank_out_of_memory_says_so_with_its_peak():
    from fedmpi.run.memory import is_out_of_memory, out_of_memory_text

    error = MemoryError("Unable to allocate 8.00 GiB for an array")
    assert is_out_of_memory(error) and not is_out_of_memory(RuntimeError("shape mismatch"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    text = out_of_memory_text(error, 2)
    assert text.startswith("rank 2 ran out of memory (MemoryError: Unable to allocate 8.00 GiB")
    assert "peak resident memory" in text and "--dry-run" in text and "client_state_memory" in text


def test_deterministic_mode_sets_torchs_switches():
    from fedmpi.mpi.runtime import set_deterministic

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    try:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        set_deterministic(False)
        assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        set_deterministic(True)
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        plain = fedmpi.simulate(synthetic_cfg(), rounds=2)
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
        if before[3] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[3]
    assert np.array_equal(plain.model, fedmpi.simulate(synthetic_cfg(), rounds=2).model)



# -- the W4 benchmark's parts (the full runs are `make bench`; their plumbing is checked here) -------------

def load_w4():
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("fedmpi_bench_w4", ROOT / "bench" / "w4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_w4_writes_femnist_shaped_data_that_fedmpi_reads(tmp_path):
    w4 = load_w4()
    root = w4.femnist_shape(tmp_path, clients=3)
    cfg = config.from_dict({"data": {"name": "emnist", "split": "byclass", "root": root},
                            "partition": {"clients": 3, "scheme": "iid"}, "server": {"clients_per_round": 3}})
    ds = load_dataset(cfg)
    assert ds.x_train.shape == (600, 1, 28, 28) and ds.x_test.shape == (60, 1, 28, 28) and ds.num_classes == 62
    assert ds.y_train.max() < 62 and len(np.unique(ds.y_train)) > 40
    assert w4.data_bytes({"data": cfg.to_dict()["data"], "partition": {"clients": 3, "scheme": "iid"},
                          "server": {"clients_per_round": 3}}) == 660 * (784 * 4 + 8)
    before = (tmp_path / "EMNIST" / "raw" / "emnist-byclass-train-images-idx3-ubyte").stat().st_mtime_ns
    w4.femnist_shape(tmp_path, clients=3)                    # kept when already there
    assert (tmp_path / "EMNIST" / "raw" / "emnist-byclass-train-images-idx3-ubyte").stat().st_mtime_ns == before


def test_w4_plan_and_growth_figures(tmp_path):
    w4 = load_w4()
    rows = w4.plan((2, 3))
    assert [(wl, label, n) for wl, label, n, _ in rows[:4]] == [("W4-lr", "fedavg", 2), ("W4-lr", "fedavg", 3),
                                                               ("W4-lr", "scaffold", 2), ("W4-lr", "scaffold", 3)]
    assert rows[-1][1:3] == ("scaffold, state <= 256MB", 3) and len(rows) == 9
    small = w4.scaled(w4.WORKLOADS["W4-lr"], 0.0001)
    assert small["partition"]["clients"] == 10 and small["server"]["clients_per_round"] == 10
    path = tmp_path / "run.h5"
    log = RunLog.create(str(path), synthetic_cfg(), 1, ["host"], {})
    for t in range(3):
        log.append({"round": t}, dense_rows(1000, [1, 5, 9]), num_clients=1000)
    log.close()
    per_round, size = w4.h5_growth(path)
    metrics = len(CORE_METRICS) * 8
    assert per_round == metrics + 4 * 3 * 4 and size == os.path.getsize(path)   # ids, selected, loss, arrived
