"""Per-rank set-up: which clients a rank hosts, which device it uses, how many torch threads it runs."""

from __future__ import annotations

import heapq
import os
import re

import numpy as np


def place_clients(sizes, workers) -> np.ndarray:
    """Host rank of every client: largest client first onto the least-loaded worker (ties: lowest rank).

    Longest-processing-time-first keeps the workers' sample counts within one client of each other and
    depends only on the sizes and the worker list, so every rank computes the same placement.
    """
    host = np.empty(len(sizes), dtype=np.int64)
    load = [(0, w) for w in sorted(workers)]
    heapq.heapify(load)
    for cid in sorted(range(len(sizes)), key=lambda c: (-int(sizes[c]), c)):
        total, w = heapq.heappop(load)
        host[cid] = w
        heapq.heappush(load, (total + int(sizes[cid]), w))
    return host


def pick_device(setting, local_rank):
    """CUDA device `local_rank mod count` when CUDA is available (or asked for), else the CPU."""
    import torch

    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from fedmpi.errors import ConfigError

        raise ConfigError("runtime.device = 'cuda': no CUDA device is visible on this node; use auto or cpu")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


BYTE_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
              "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value) -> int:
    """Bytes from an integer or a text such as "4GB" or "512 MiB" (decimal kB..TB, binary KiB..TiB, any case);
    ValueError naming the accepted forms otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("must be a number of bytes or a text such as '4GB' or '512MiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be >= 0")
        return value
    m = _SIZE.match(value)
    unit = m.group(2).upper() if m else None
    if not m or unit not in BYTE_UNITS:
        raise ValueError("must be a number of bytes or a number with a unit (B, kB, MB, GB, TB, KiB, MiB, GiB, "
                         "TiB), such as '4GB' or '512MiB'")
    return int(float(m.group(1)) * BYTE_UNITS[unit])


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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
    on a GPU (docs/performance.md); on a CPU fedmpi's kernels are deterministic already."""
    import torch

    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
