"""Node buffers (fedmpi.mpi.node_buffers): with every rank on one node the round's broadcast and reduction go
through node-shared memory instead of MPI's collectives. A run must be bit-identical either way, for each
protocol's use of the round buffers: FedAvg's whole buffers with evaluation (the model shared again for
it), gated SAFL's statistics-only reduction (a slice), FedSkip's header-only broadcasts and point-to-point
slots, and rank 0 training clients as well (`server.trains_clients`, -n 2).

One launch per rank count (shared with other files, tests/session_runs.py) runs every config with node
buffers on and then off."""

import pytest
import session_runs
from conftest import read_global, read_metrics, same, small_config, write_config

pytestmark = pytest.mark.mpi

RUNS = {
    "fedavg_eval": {"eval": {"every": 1}},
    "safl_gated": {"algorithm": {"name": "safl", "eps": 0.5, "L": 5.0, "gating": True, "nu": 20.0}},
    "fedskip": {"algorithm": {"name": "fedskip", "delta": 2}, "rounds": 4},
}
N2 = {"fedavg_rank0_trains": {"server": {"clients_per_round": 6, "trains_clients": True}}}


@session_runs.plan
def node_buffer_runs(base):
    """Every run with node buffers on and off, at -n 3 (RUNS) and -n 2 (N2), in the launches shared with
    other files (tests/session_runs.py); FEDMPI_NODE_BUFFERS is read when a run sets up its round buffers,
    so it is set per run."""
    steps = {n: [[{"FEDMPI_NODE_BUFFERS": setting}, "run",
                  write_config(base / f"{name}-{setting}.yaml", small_config(base / setting / name, **sections)),
                  "--overwrite"]
                 for setting in ("1", "0") for name, sections in runs.items()]
             for n, runs in ((3, RUNS), (2, N2))}
    return steps, base


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, node_buffer_runs)


@pytest.mark.parametrize("name", [*RUNS, *N2])
def test_node_buffers_and_mpi_collectives_give_the_same_run(runs, name):
    on, off = runs / "1" / name, runs / "0" / name
    (m_on, attrs_on), (m_off, _) = read_metrics(on), read_metrics(off)
    assert attrs_on["status"] == "finished"
    assert same(m_on["model_sha256"], m_off["model_sha256"])
    for key in ("train_loss", "test_acc", "test_loss", "uploads", "bytes_up"):
        assert same(m_on[key], m_off[key]), key
    assert (read_global(on) == read_global(off)).all()
