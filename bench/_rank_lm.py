"""bench/_rank.py for runs of a Hugging Face model (bench/lora_bench.py): the same rank, with two changes.

- This folder moves to the end of the module search path first: started as a script, a file's folder comes
  first, where bench/kernels.py would shadow the `kernels` package that transformers imports when it is
  installed; _rank.py's own `import pacing` still finds bench/pacing.py at the end.
- Where memory is sampled ($FEDMPI_BENCH_SAMPLE_MEMORY, as for _rank.py), after every round the rank's PSS
  (/proc/self/smaps_rollup, after glibc's malloc_trim hands the round's freed activations back) is read and, at
  exit, written to $FEDMPI_BENCH_STATS/pss-rank-<rank>.json: the memory held between rounds, once the node's
  shared base has replaced the private copy each rank builds (_rank.py's sampled peak also catches that
  moment of building). The speed runs, not sampled, pay nothing for it.
"""

import atexit
import json
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != HERE] + [HERE]

from proc_memory import mpi_rank, smaps_kb  # noqa: E402 - bench/proc_memory.py, at the path's end

import fedmpi.round.engine as engine  # noqa: E402 - after the path is set

AFTER_ROUNDS = []       # PSS in MB at the end of each round


def _pss_mb():
    return smaps_kb(trim=True)["pss"] / 1024.0


def _write():
    folder = os.environ.get("FEDMPI_BENCH_STATS")
    if folder:
        with open(os.path.join(folder, f"pss-rank-{mpi_rank()}.json"), "w") as fh:
            json.dump({"rank": mpi_rank(), "round_pss_mb": AFTER_ROUNDS}, fh)


_run_round = engine.run_round


def _round_then_pss(parts, t, **kwargs):
    try:
        return _run_round(parts, t, **kwargs)
    finally:
        AFTER_ROUNDS.append(_pss_mb())


if os.environ.get("FEDMPI_BENCH_SAMPLE_MEMORY"):
    engine.run_round = _round_then_pss      # _rank.py wraps this one in turn (its timing stays around the round)
    atexit.register(_write)
runpy.run_path(os.path.join(HERE, "_rank.py"))
