"""How the update matrix is cut into chunks of coordinates, and how large a chunk may be.

Rank 0 never holds the round's S x d matrix of updates: it receives S x c chunks (c coordinates of every
counted client) one after another and an aggregator works through them in passes. The bound is
`runtime.gather_memory` bytes for the chunk and the aggregator's working copies of it, BYTES_PER_ENTRY bytes
per entry of the chunk (see below); null sizes it from the machine, GATHER_SHARE of the memory available
when the run starts. The chunk width is a multiple of BLOCK coordinates, and at least one BLOCK, so the
floor of the bound is S x BLOCK x BYTES_PER_ENTRY (13 MB at S = 100).

Sums across coordinates (distances, norms, dot products) are accumulated block by block, BLOCK coordinates
at a time in increasing order, whatever the chunk width: the result of every aggregator is therefore the
same for any gather_memory, and for any -n (tests/test_robust.py checks chunked == unchunked).
"""

from __future__ import annotations

import os

BLOCK = 4096
# Per entry of a chunk on rank 0: the float32 rows as received (4) and in client-id order (4), the float64
# copy the arithmetic runs in (8), and the order statistics' sorted values (8) or, for Bulyan, sort indices (8).
BYTES_PER_ENTRY = 32
GATHER_SHARE = 0.25


def available_bytes() -> int:
    """Memory available to new allocations on this machine (MemAvailable; all memory where it is unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget() -> int:
    """runtime.gather_memory's default: GATHER_SHARE of the memory available now."""
    return int(GATHER_SHARE * available_bytes())


def chunk_width(budget, rows, dim, block=BLOCK) -> int:
    """Coordinates per chunk for `rows` clients within `budget` bytes: a multiple of `block`, at least one
    block, at most the whole vector."""
    per_block = max(rows, 1) * block * BYTES_PER_ENTRY
    width = max(int(budget) // per_block, 1) * block
    return min(width, dim) if dim > 0 else block


def chunk_bounds(dim, width) -> list:
    """[(lo, hi), ...] of the chunks of `width` coordinates covering 0..dim."""
    return [(lo, min(lo + width, dim)) for lo in range(0, dim, width)]


def blocks(lo, hi, block=BLOCK):
    """(a, b) slices, relative to `lo`, of the BLOCK grid inside the chunk [lo, hi) (lo is on the grid)."""
    return [(a - lo, min(a + block, hi) - lo) for a in range(lo, hi, block)]
