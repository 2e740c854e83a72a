"""Per-rank set-up: which clients a rank hosts, which device it uses, how many torch threads it runs."""

from __future__ import annotations

import decimal
import heapq
import os
import re

import numpy as np

from fedmpi.core.errors import ConfigError

# Placements of at most this many clients (a round's selection, a small federation) are evened out after
# LPT; for more, LPT alone is within one client of the mean, a small fraction of a worker's load.
EVEN_OUT_MAX = 512


def place_clients(sizes, workers) -> np.ndarray:
    """Host rank of every client: largest client first onto the least-loaded worker (ties: lowest rank),
    then evened out by moves and swaps (`_even_out`, up to EVEN_OUT_MAX clients).

    Longest-processing-time-first keeps the workers' sample counts within one client of each other, which
    for a round of 10 Dirichlet clients on two workers still leaves the busier one ~2% above the mean (the
    other waits); evening out brings that to ~0.2% (the quickstart's selections). Depends only on the sizes
    and the worker list, so every rank computes the same placement.
    """
    host = np.empty(len(sizes), dtype=np.int64)
    load = [(0, w) for w in sorted(workers)]
    heapq.heapify(load)
    for cid in sorted(range(len(sizes)), key=lambda c: (-int(sizes[c]), c)):
        total, w = heapq.heappop(load)
        host[cid] = w
        heapq.heappush(load, (total + int(sizes[cid]), w))
    if 2 < len(sizes) <= EVEN_OUT_MAX and len(workers) > 1:
        _even_out(np.asarray(sizes, dtype=np.int64), host, sorted(workers))
    return host


def _even_out(cost, host, workers):
    """Local search on `host` in place: while moving a client off the most-loaded worker, or swapping one of
    its clients for a smaller one of another worker, lowers that worker's load without raising the other's
    above it, make the change that leaves the two most even (ties: lowest worker, then lowest client ids).
    Every change lowers the sorted vector of loads, so the search ends; it is bounded anyway."""
    for _ in range(4 * len(cost)):
        load = {w: int(cost[host == w].sum()) for w in workers}
        hi = max(workers, key=lambda w: (load[w], -w))
        mine = np.flatnonzero(host == hi)
        best = None
        for lo in workers:
            gap = load[hi] - load[lo]
            if lo == hi or gap <= 1:
                continue
            theirs = np.concatenate([[-1], np.flatnonzero(host == lo)])       # -1: a move, nothing back
            back = np.concatenate([[0], cost[theirs[1:]]])
            shift = cost[mine][:, None] - back[None, :]                          # load leaving hi for lo
            after = np.where((shift > 0) & (shift < gap), np.maximum(load[hi] - shift, load[lo] + shift), load[hi])
            i, j = np.unravel_index(np.argmin(after), after.shape)
            if after[i, j] < load[hi] and (best is None or after[i, j] < best[0]):
                best = (after[i, j], mine[i], theirs[j], lo)
        if best is None:
            return
        _, a, b, lo = best
        host[a] = lo
        if b >= 0:
            host[b] = hi


def pick_device(setting, local_rank):
    """CUDA device `local_rank mod count` when CUDA is available (or asked for), else the CPU."""
    import torch

    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("runtime.device = 'cuda': no CUDA device is visible on this node; use auto or cpu")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


BYTE_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
              "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}
MAX_BYTES = 2 ** 63 - 1    # sizes are compared with 64-bit byte counts
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value) -> int:
    """Bytes from an integer or a text such as "4GB" or "512 MiB" (decimal kB..TB, binary KiB..TiB, any case);
    ValueError naming the accepted forms otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be a number of bytes or a text such as '4GB' or '512MiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be >= 0")
        return _bounded(value)
    m = _SIZE.match(value)
    unit = m.group(2).upper() if m else None
    if not m or unit not in BYTE_UNITS:
        raise ValueError("must be a number of bytes or a number with a unit (B, kB, MB, GB, TB, KiB, MiB, GiB, "
                         "TiB), such as '4GB' or '512MiB'")
    # Decimal, not float: 400 digits overflowed float() to inf (OverflowError in int()); the digits are few
    # (the text is a config value), so the product is exact and cheap.
    return _bounded(int(decimal.Decimal(m.group(1)) * BYTE_UNITS[unit]))


def _bounded(size):
    if size > MAX_BYTES:
        raise ValueError(f"must be at most {MAX_BYTES} bytes (2^63 - 1, about 9.2 EB)")
    return size


def usable_cores() -> int:
    return len(usable_cpus())


def usable_cpus() -> set:
    """The ids of the CPUs this process may run on (all of them where the platform cannot tell)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def set_threads(setting, computing_ranks_on_node, cores=None) -> int:
    """Torch threads for this rank: the node's cores (`cores`, default this process's) shared by the ranks
    that compute on it.

    The server rank sleeps while workers train, so it is not counted; it gets the same share.
    """
    import torch

    threads = setting or max(1, (cores or usable_cores()) // max(1, computing_ranks_on_node))
    torch.set_num_threads(threads)
    return threads


# cuBLAS reads its workspace setting when it creates its handle (first use on a device): the value torch's
# reproducibility notes name for deterministic GEMMs.
CUBLAS_WORKSPACE = ":4096:8"


def set_deterministic(enabled):
    """`runtime.deterministic`: deterministic kernels everywhere torch has them, an error where it has none
    (torch names the operation), cuDNN's autotuner off. Set before any CUDA work of the process. Costs speed
    on a GPU (docs/results/performance.md); on a CPU fedmpi's kernels are deterministic already."""
    import torch

    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
