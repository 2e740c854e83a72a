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
