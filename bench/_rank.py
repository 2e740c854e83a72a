"""One benchmark rank: `fedmpi` exactly as `python -m fedmpi ARGS` runs it, plus this rank's peak memory, CPU
seconds and CPU seconds of each round (`fedmpi.round.engine.run_round`, wrapped here) written at exit to
$FEDMPI_BENCH_STATS/rank-<rank>.json (read by bench/bench.py).

Peak memory is the kernel's peak resident set (`ru_maxrss`: every page the rank touched, its share of the
node's shared data included), and, where $FEDMPI_BENCH_SAMPLE_MEMORY is set (W4), sampled every SAMPLE_S
from /proc/self/smaps_rollup and once at exit, the peak proportional set size (PSS: a page shared by k
processes counts 1/k) and the peak private memory (USS). Sampling is off for the speed workloads: reading
smaps_rollup of a process with torch's mappings costs milliseconds of CPU, which the per-round CPU figures
would count (W1 at -n 3 measured 1.06 s/round with 50 ms sampling, 0.72 without).

Launched as `mpiexec -n P python bench/_rank.py run CONFIG --overwrite`.
"""

import atexit
import json
import os
import resource
import sys
import threading
import time

from proc_memory import mpi_rank, smaps_kb  # bench/proc_memory.py (this script's folder is on sys.path)

BEGAN = time.monotonic()
SAMPLE_S = 0.25
SAMPLING = bool(os.environ.get("FEDMPI_BENCH_SAMPLE_MEMORY"))
PEAKS = {"pss_kb": 0, "uss_kb": 0}
BATON = None    # bench/pacing.Baton once fedmpi is imported (below), where the bench pairs round by round


def _sample_once():
    """Updates the peak PSS and USS from /proc/self/smaps_rollup; False where it cannot be read."""
    try:
        now = smaps_kb()
    except OSError:
        return False
    PEAKS["pss_kb"] = max(PEAKS["pss_kb"], now["pss"])
    PEAKS["uss_kb"] = max(PEAKS["uss_kb"], now["uss"])
    return True


def _sample_memory():
    """Peak PSS and USS of this process, sampled until it exits (a daemon thread)."""
    while _sample_once():
        time.sleep(SAMPLE_S)


if SAMPLING:
    threading.Thread(target=_sample_memory, daemon=True).start()


# The node's round window (fedmpi.mpi.node_buffers): [start, end) of every rank's slots and the bytes of this
# rank's own, recorded where it is made (below), so that the memory a rank holds can leave out the other
# ranks' slots it reads (rank 0 sums the workers' reduction slots, a worker copies rank 0's broadcast slot:
# their pages count in this rank's RSS, and in its PSS by half, though their owners hold them).
WINDOW = {}


def _others_slots_kb():
    """Resident kB of the other ranks' slots of the round window mapped by this process (0 without one)."""
    if not WINDOW:
        return 0
    total, start, end = 0, WINDOW["start"], WINDOW["end"]
    try:
        with open("/proc/self/smaps") as fh:
            overlaps = False
            for line in fh:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    overlaps = lo < end and hi > start
                elif overlaps and head == "Rss:":
                    total += int(line.split()[1])
    except OSError:
        return 0
    return max(0, total - WINDOW["own_kb"])


def _write_stats():
    folder = os.environ.get("FEDMPI_BENCH_STATS")
    if not folder:
        return
    if SAMPLING:
        _sample_once()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats = {"rank": mpi_rank(), "peak_rss_mb": usage.ru_maxrss / 1024.0, "cpu_s": usage.ru_utime + usage.ru_stime,
             "wall_s": time.monotonic() - BEGAN, "round_cpu_s": [cpu for _, cpu in ROUNDS],
             "round_wall_s": [wall for wall, _ in ROUNDS], "pace_wait_s": BATON.waited if BATON else 0.0}
    if SAMPLING:        # (bench.py reads missing peaks as NaN)
        stats.update(peak_pss_mb=PEAKS["pss_kb"] / 1024.0, peak_uss_mb=PEAKS["uss_kb"] / 1024.0,
                     others_slots_mb=WINDOW.get("others_kb", _others_slots_kb()) / 1024.0)
    with open(os.path.join(folder, f"rank-{stats['rank']}.json"), "w") as fh:
        json.dump(stats, fh)


atexit.register(_write_stats)

import pacing  # noqa: E402 - bench/pacing.py (this script's folder is on sys.path)

import fedmpi.round.engine as engine  # noqa: E402 - the clock above starts before the imports
from fedmpi.cli import main  # noqa: E402

ROUNDS = []     # (wall s, CPU s) of each fedmpi.round.engine.run_round on this rank
_run_round = engine.run_round
# Round-by-round pairing (bench/pacing.py): every rank waits for its turn before a round, rank 0 (whose
# run_round spans the whole round: the broadcast opens it, the reduction, server step and evaluation close
# it) reports the round done. None when the bench runs jobs one after the other.
BATON = pacing.Baton.from_env()


def _timed_round(parts, t, **kwargs):
    if BATON:
        BATON.wait()
    wall, cpu = time.monotonic(), time.process_time()
    try:
        return _run_round(parts, t, **kwargs)
    finally:
        ROUNDS.append((time.monotonic() - wall, time.process_time() - cpu))
        if BATON and mpi_rank() == 0:
            BATON.done()


engine.run_round = _timed_round     # the run loop calls it through the module (fedmpi.run.launch._loop)

if SAMPLING:
    import fedmpi.mpi.node_buffers as node_buffers  # noqa: E402

    _node_init = node_buffers.NodeBuffers.__init__

    def _recorded_window(self, *args, **kwargs):
        _node_init(self, *args, **kwargs)
        slots = [a for a in (*self.up, self.down) if a.size]       # the reduction slots, rank 0's broadcast slot
        addresses = [(a.__array_interface__["data"][0], a.nbytes) for a in slots]
        own = self.up[self.rank].nbytes + (self.down.nbytes if self.rank == 0 else 0)
        WINDOW.update(start=min(a for a, _ in addresses), end=max(a + n for a, n in addresses), own_kb=own // 1024)

    _node_free = node_buffers.NodeBuffers.free

    def _measured_free(self):
        WINDOW["others_kb"] = _others_slots_kb()        # while the window is still mapped
        _node_free(self)

    node_buffers.NodeBuffers.__init__ = _recorded_window
    node_buffers.NodeBuffers.free = _measured_free

code = main(sys.argv[1:])
sys.stdout.flush()
sys.exit(code)
