"""Per-rank set-up: which clients a rank hosts, which device it uses, how many torch threads it runs."""

from __future__ import annotations

import heapq
import os

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


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def set_threads(setting, computing_ranks_on_node) -> int:
    """Torch threads for this rank: the node's cores shared by the ranks that compute on it.

    The server rank sleeps while workers train, so it is not counted; it gets the same share.
    """
    import torch

    threads = setting or max(1, usable_cores() // max(1, computing_ranks_on_node))
    torch.set_num_threads(threads)
    return threads
