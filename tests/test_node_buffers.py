"""Node buffers (fedmpi.mpi.node_buffers): with every rank on one node the round's broadcast and reduction go
through node-shared memory instead of MPI's collectives. A run must be bit-identical either way, for each
protocol's use of the round buffers: FedAvg's whole buffers with evaluation (the model shared again for
it), gated SAFL's statistics-only reduction (a slice), FedSkip's header-only broadcasts and point-to-point
slots, and rank 0 training clients as well (`server.trains_clients`, -n 2).

One launch per setting and rank count runs every config (tools/run_batch.py)."""

import pytest
from conftest import read_global, read_metrics, run_many, same, small_config, write_config

pytestmark = pytest.mark.mpi

RUNS = {
    "fedavg_eval": {"eval": {"every": 1}},
    "safl_gated": {"algorithm": {"name": "safl", "eps": 0.5, "L": 5.0, "gating": True, "nu": 20.0}},
    "fedskip": {"algorithm": {"name": "fedskip", "delta": 2}, "rounds": 4},
}
N2 = {"fedavg_rank0_trains": {"server": {"clients_per_round": 6, "trains_clients": True}}}


def launch(n, base, setting, runs):
    paths = [write_config(base / f"{name}-{setting}.yaml", small_config(base / setting / name, **sections))
             for name, sections in runs.items()]
    run_many(n, paths, timeout=300, env={"FEDMPI_NODE_BUFFERS": setting})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("node_buffers")
    for setting in ("1", "0"):
        launch(3, base, setting, RUNS)
        launch(2, base, setting, N2)
    return base


@pytest.mark.parametrize("name", [*RUNS, *N2])
def test_node_buffers_and_mpi_collectives_give_the_same_run(runs, name):
    on, off = runs / "1" / name, runs / "0" / name
    (m_on, attrs_on), (m_off, _) = read_metrics(on), read_metrics(off)
    assert attrs_on["status"] == "finished"
    assert same(m_on["model_sha256"], m_off["model_sha256"])
    for key in ("train_loss", "test_acc", "test_loss", "uploads", "bytes_up"):
        assert same(m_on[key], m_off[key]), key
    assert (read_global(on) == read_global(off)).all()
