"""Vectors beyond 2^31 bytes (fedmpi.mpi.large_count): MpiComm's broadcast, reductions (float64 and
secure aggregation's uint64), gathers, routes and state streaming move them exactly.

Two launches of tests/mpi_scripts/large_count_check.py: one at -n 3 with small vectors and a 64-byte slice
limit (FEDMPI_MPI_CHUNK_BYTES), so that the slicing itself runs everywhere; one at -n 2 with buffers just
over 2^31 bytes, also broadcast as uint8 (a count over 2^31 - 1: the library's own path, MPI-4 large counts
where it has them), skipped where the machine's free memory cannot hold the copies each rank keeps (about
10 GiB in all at the peak, rank 0's gather).
"""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, mpiexec

from fedmpi.mpi import large_count

SCRIPT = ROOT / "tests" / "mpi_scripts" / "large_count_check.py"
NEEDED_GIB = 14         # free memory below which the 2 GiB launch is skipped (its peak is ~10 GiB)


def test_slices_cover_the_vector_within_the_limit():
    cuts = large_count.slices(10, 4, 12)
    assert cuts == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    assert large_count.slices(10, 4, None) == [slice(0, 10)]
    assert large_count.slices(10, 4, 40) == [slice(0, 10)]
    assert large_count.slices(0, 4, 12) == [slice(0, 0)]           # every rank still makes one call
    assert large_count.slices(3, 8, 1) == [slice(0, 1), slice(1, 2), slice(2, 3)]    # at least one entry


def test_limit_follows_the_library_and_the_override(monkeypatch):
    class Mpi3:
        @staticmethod
        def Get_version():  # noqa: N802 - mpi4py's spelling
            return (3, 1)

    class Mpi4:
        @staticmethod
        def Get_version():  # noqa: N802
            return (4, 0)

    monkeypatch.delenv(large_count.CHUNK_ENV, raising=False)
    assert large_count.limit_bytes(Mpi3) == 2**31 - 1
    assert large_count.limit_bytes(Mpi4) is None
    assert large_count.gather_limit(Mpi4) == 2**31 - 1
    monkeypatch.setenv(large_count.CHUNK_ENV, "64")
    assert large_count.limit_bytes(Mpi4) == 64 == large_count.gather_limit(Mpi3)


def _launch(tmp_path, n, elements, env):
    subprocess.run([mpiexec(), "-n", str(n), sys.executable, str(SCRIPT), str(elements), str(tmp_path / "calls")],
                   check=True, timeout=300, cwd=ROOT, capture_output=True, env={**os.environ, **env})
    return [json.loads((tmp_path / f"calls-{r}.json").read_text()) for r in range(n)]


@pytest.mark.mpi
def test_sliced_transfers_are_exact_at_n3(tmp_path):
    calls = _launch(tmp_path, 3, 100, {large_count.CHUNK_ENV: "64"})
    # 400 bytes (as float32, then as uint8) in 64-byte slices: 7 broadcasts each; 50 float64 (or uint64):
    # 7 reductions each.
    assert all(c["Bcast"] == 14 and c["Reduce"] == 14 for c in calls), calls
    # gather_rows (3 rows of 33: 5 columns a slice, 7 slices), masked_gather (mask, then 4 rows bound: 4
    # columns a slice, 25 slices).
    assert all(c["Gatherv"] == 7 + 1 + 25 for c in calls), calls


def _free_gib():
    try:
        import psutil

        return psutil.virtual_memory().available / 2**30
    except ImportError:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        return int(info["MemAvailable"].split()[0]) / 2**20


@pytest.mark.mpi
def test_buffers_over_2gib_at_n2(tmp_path):
    free = _free_gib()
    if free < NEEDED_GIB:
        pytest.skip(f"{free:.1f} GiB of memory available; the 2 GiB transfers need about {NEEDED_GIB} GiB")
    calls = _launch(tmp_path, 2, 0, {})
    # One call each where MPI has large counts; the gather over 2^31 bytes is always sliced by columns.
    if large_count.has_large_count(_mpi()):
        assert all(c["Bcast"] == 2 and c["Reduce"] == 2 for c in calls), calls
    assert all(c["Gatherv"] == 2 for c in calls), calls


def _mpi():
    from mpi4py import MPI

    return MPI
