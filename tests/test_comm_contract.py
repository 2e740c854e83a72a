"""Both communicators keep one contract (`fedmpi.mpi.base.Comm`), checked by one test body
(tests/mpi_scripts/comm_contract.py): `LocalComm` in this process, `MpiComm` under mpiexec at -n 1 and -n 3."""

import json
import subprocess
import sys

import pytest
from conftest import MPI_TIMEOUT_S, ROOT, mpiexec

sys.path.insert(0, str(ROOT / "tests" / "mpi_scripts"))
from comm_contract import exercise  # noqa: E402

from fedmpi.mpi.base import Comm  # noqa: E402
from fedmpi.mpi.local import LocalComm  # noqa: E402

SCRIPT = ROOT / "tests" / "mpi_scripts" / "comm_contract.py"


def test_local_comm_keeps_the_contract():
    exercise(LocalComm())


def test_an_object_missing_a_collective_is_no_comm():
    class Partial:
        rank, size, workers, timer = 0, 1, (0,), None

        def bcast(self, buf):
            return buf

    assert not isinstance(Partial(), Comm)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_mpi_comm_keeps_the_contract(tmp_path, n):
    subprocess.run([mpiexec(), "-n", str(n), sys.executable, str(SCRIPT), str(tmp_path / "r")], check=True,
                   timeout=MPI_TIMEOUT_S, cwd=ROOT, capture_output=True)
    for rank in range(n):
        result = json.loads((tmp_path / f"r-{rank}.json").read_text())
        assert result["ok"], result.get("error")
        assert result["type"] == "MpiComm" and result["size"] == n


class _Request:
    def __init__(self, done):
        self.done = done

    def Test(self, status=None):  # noqa: N802 - mirrors mpi4py
        return self.done


def _server_with_report(text, round_):
    """An MpiComm on rank 0 (no MPI needed) whose standing failure receive holds `text`, in round `round_`."""
    from fedmpi.mpi.comm import MpiComm

    comm = object.__new__(MpiComm)
    comm._failure, comm._failure_round, comm.round = None, None, round_
    comm._failure_buf = bytearray(text.encode()) + bytearray(8)
    comm._failure_req = _Request(True)

    class Status:
        def Get_source(self):
            return 2

    comm._status = Status()
    return comm


def test_a_worker_failure_from_a_later_round_lets_the_servers_collective_finish():
    """A worker that failed in round t+1 has finished round t's collectives: the server, still waiting in round
    t for another rank, goes on waiting (its round completes and is logged); in round t+1 the failure raises,
    named and without the round line."""
    from fedmpi.mpi.base import WorkerFailed
    from fedmpi.mpi.comm import ROUND_MARK

    comm = _server_with_report(f"{ROUND_MARK}1\nrank 2 failed: RuntimeError: boom", round_=0)
    comm._check_failures(_Request(False))       # round 0: deferred
    comm.enter_round(1)
    with pytest.raises(WorkerFailed) as info:
        comm._check_failures(_Request(False))
    assert info.value.rank == 2 and info.value.text == "rank 2 failed: RuntimeError: boom"


@pytest.mark.parametrize("report", ["@round 0\nrank 2 failed: x", "rank 2 failed: x"])
def test_a_worker_failure_in_the_servers_round_or_at_set_up_raises_at_once(report):
    from fedmpi.mpi.base import WorkerFailed

    comm = _server_with_report(report, round_=0)
    with pytest.raises(WorkerFailed):
        comm._check_failures(_Request(False))
    comm = _server_with_report(report, round_=0)
    comm._check_failures(_Request(True))        # the collective completed: raised at a later wait
