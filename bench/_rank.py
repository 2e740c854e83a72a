"""One benchmark rank: `fedmpi` exactly as `python -m fedmpi ARGS` runs it, plus this rank's peak memory, CPU
seconds and CPU seconds of each round (`Experiment.run_round`, wrapped here) written at exit to
$FEDMPI_BENCH_STATS/rank-<rank>.json (read by bench/bench.py).

Launched as `mpiexec -n P python bench/_rank.py run CONFIG --overwrite`.
"""

import atexit
import json
import os
import resource
import sys
import time

BEGAN = time.monotonic()


def _rank():
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def _write_stats():
    folder = os.environ.get("FEDMPI_BENCH_STATS")
    if not folder:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats = {"rank": _rank(), "peak_rss_mb": usage.ru_maxrss / 1024.0, "cpu_s": usage.ru_utime + usage.ru_stime,
             "wall_s": time.monotonic() - BEGAN, "round_cpu_s": [cpu for _, cpu in ROUNDS]}
    with open(os.path.join(folder, f"rank-{stats['rank']}.json"), "w") as fh:
        json.dump(stats, fh)


atexit.register(_write_stats)

from fedmpi import experiment  # noqa: E402 - the clock above starts before the imports
from fedmpi.cli import main  # noqa: E402

ROUNDS = []     # (wall s, CPU s) of each Experiment.run_round on this rank
_run_round = experiment.Experiment.run_round


def _timed_round(self, t):
    wall, cpu = time.monotonic(), time.process_time()
    try:
        return _run_round(self, t)
    finally:
        ROUNDS.append((time.monotonic() - wall, time.process_time() - cpu))


experiment.Experiment.run_round = _timed_round

code = main(sys.argv[1:])
sys.stdout.flush()
sys.exit(code)
