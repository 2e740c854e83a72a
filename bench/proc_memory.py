"""This process's memory and MPI rank, for the benchmarks' ranks (bench/_rank.py, bench/_rank_lm.py,
bench/lora_memory.py): the one reader of /proc/self/smaps_rollup they share."""

from __future__ import annotations

import os


def smaps_kb(trim=False) -> dict:
    """{"pss": kB, "uss": kB} of this process from /proc/self/smaps_rollup (PSS: a page shared by k processes
    counts 1/k; USS: its private pages). With `trim`, glibc's malloc_trim first hands back what the allocator
    keeps free for later (a round's freed activations), so that what is counted is what is held. OSError where
    the file cannot be read."""
    if trim:
        import ctypes

        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
    with open("/proc/self/smaps_rollup") as fh:
        info = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in fh if ":" in line[:20])
                if v.split() and v.split()[0].isdigit()}
    return {"pss": info.get("Pss", 0), "uss": info.get("Private_Clean", 0) + info.get("Private_Dirty", 0)}


def mpi_rank() -> int:
    """This process's rank in its MPI job, from the launcher's environment (0 outside one)."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0
