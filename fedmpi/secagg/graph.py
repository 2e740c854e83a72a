"""Who masks with whom and who holds whose shares: the round's communication graph.

SecAgg (Bonawitz et al. 2017) uses the complete graph on the cohort. SecAgg+ (Bell et al. 2020) uses a
k-regular graph: a Harary graph H(k, n) on a ring of the cohort in a random order (the server's choice,
here drawn from (seed, SECAGG, round)), each client joined to the k/2 nearest on either side. k = n - 1 is
the complete graph. Every rank derives the same graph from the plan and the seed.
"""

from __future__ import annotations

import math

import numpy as np

from fedmpi.core import rng
from fedmpi.secagg.agreement import GRAPH


def default_neighbours(cohort: int) -> int:
    """The smallest even k >= log2(cohort), at most cohort - 1 (Bell et al.'s k = O(log n))."""
    k = max(2, math.ceil(math.log2(max(cohort, 2))))
    k += k % 2
    return min(k, cohort - 1)


def complete(cohort) -> dict:
    cohort = [int(c) for c in cohort]
    return {u: [v for v in cohort if v != u] for u in cohort}


def harary(cohort, k: int, seed: int, round_: int) -> dict:
    """{client: sorted neighbours} of H(k, n) on the cohort's ring in the round's random order; k even or
    n - 1."""
    cohort = [int(c) for c in cohort]
    n = len(cohort)
    if k >= n - 1:
        return complete(cohort)
    if k % 2:
        raise ValueError(f"a Harary graph with k < n - 1 needs an even k, not {k}")
    ring = [cohort[i] for i in rng.stream(seed, rng.SECAGG, round_, GRAPH).permutation(n)]
    out = {u: set() for u in cohort}
    for pos, u in enumerate(ring):
        for step in range(1, k // 2 + 1):
            v = ring[(pos + step) % n]
            out[u].add(v)
            out[v].add(u)
    return {u: sorted(vs) for u, vs in out.items()}


def round_graph(mode: str, cohort, k: int, seed: int, round_: int) -> dict:
    if mode == "secagg_plus":
        return harary(cohort, k, seed, round_)
    return complete(cohort)


def is_regular(graph: dict, k: int) -> bool:
    return all(len(vs) == k for vs in graph.values()) and all(u in graph[v] for u, vs in graph.items()
                                                              for v in vs)


def degrees(graph: dict) -> np.ndarray:
    return np.array([len(vs) for vs in graph.values()], dtype=np.int64)
