"""Memory, ahead and after the fact: the size estimate `fedmpi run --dry-run` prints (data, model, client
state and log bytes per rank and per node), and the message when a rank runs out of memory.

The estimate follows what a run holds: the data set once per node in a shared window, each rank
charged its share of it (`runtime.shared_data`; the whole set per rank when off); every rank's index
arrays of the partition; the flat model with its gradient and the wire's buffers on every rank, plus the
server's state on rank 0; per-client vectors on the hosting ranks, in memory up to
`runtime.client_state_memory` and on disk beyond; run.h5 growing by the rows of the clients each round
names. Python, torch, MPI and fedmpi themselves take about 0.6 GB per process before any data, on top
(measured: docs/results/performance.md, the Shakespeare set-up and W4).
"""

from __future__ import annotations

import math
import os
import resource

import numpy as np

from fedmpi.algorithms.state import ClientVectors
from fedmpi.core.shared_base import frozen_size
from fedmpi.data.array_sizes import node_memory_bytes
from fedmpi.mpi.runtime import place_clients

GB = 1e9
MB = 1e6
IN_MEMORY = ("data", "frozen base", "partition index", "model and buffers", "client state in memory")
PHASES_ESTIMATE = 8         # /timing phases per rank (fedmpi.core.timing.PHASES, about)
METRICS_ESTIMATE = 24       # /metrics figures per round (the core ones, lrs, drift figures, fingerprint...)


def client_vector_count(algo, cfg):
    """Vectors an algorithm keeps per client (its ClientVectors, plus compression residuals with error
    feedback, one per compressed upload)."""
    count = sum(isinstance(v, ClientVectors) for v in vars(algo).values())
    compress = cfg.client.compress
    return count + int(compress.name != "none" and compress.error_feedback)


def estimate(cfg, dataset, parts, flat, algo, ranks):
    """Bytes by kind for a run of `ranks` ranks on one node: {kind: (per rank, per node)} (per rank: the
    largest rank's share)."""
    data = sum(a.nbytes for a in (dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test))
    index = sum(len(p) for p in parts) * 8
    shared = cfg.runtime.shared_data and ranks > 1
    dim, n_params = flat.dim, flat.n_params
    # flat vector + gradient (+ momentum), the broadcast (float32) and reduction (float64) buffers, the accumulator
    model = 4 * dim * (1 + algo.down_vectors) + 4 * n_params * (1 + (cfg.client.momentum > 0)) \
        + 8 * dim * 2 * algo.up_vectors
    server = 4 * dim * 2 + 8 * dim * 2      # the global model, the optimizer's moments (float64), the update
    workers = list(range(1, ranks)) or [0]
    sizes = np.array([len(p) for p in parts])
    hosted = np.bincount(place_clients(sizes, workers), minlength=ranks).max()
    state = int(hosted) * client_vector_count(algo, cfg) * 4 * dim
    bound = cfg.runtime.client_state_bytes
    in_memory = state if bound is None else min(state, bound)
    columns = 2 + len(algo.client_columns) + 1          # selected, loss, the algorithm's, the ids
    log = 100 * (cfg.server.clients_per_round * 4 * columns + 8 * (METRICS_ESTIMATE + dataset.num_classes)
                 + 8 * PHASES_ESTIMATE * ranks)
    data_rank = math.ceil(data / ranks) if shared else data
    # A frozen base (LoRA's) is in the node's shared window at -n > 1 on CPU nodes (fedmpi.core.shared_base):
    # once per node, each rank charged its share; `model and buffers` is the flat vector, the adapters.
    base = frozen_size(flat.module)[1]
    base_shared = ranks > 1 and flat.device.type == "cpu"
    return {
        "data": (data_rank, data if shared else data * ranks),
        "frozen base": (math.ceil(base / ranks) if base_shared else base, base if base_shared else base * ranks),
        "partition index": (index, index * ranks),
        "model and buffers": (model + server, model * ranks + server),
        "client state in memory": (in_memory, in_memory * len(workers)),
        "client state spilled to disk": (state - in_memory, (state - in_memory) * len(workers)),
        "run.h5 per 100 rounds": (log, log),
    }


def launcher_size():
    """The world size a launcher announced in the environment (MPICH/hydra, Open MPI, SLURM), or None."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def dry_run_lines(cfg, dataset, parts, flat, algo):
    """The size table `--dry-run` prints: each kind's bytes per rank and per node, for 2, 4 and 8 ranks on a
    node (and the launcher's count, when run under one)."""
    counts = sorted({2, 4, 8} | ({launcher_size()} - {None}))
    lines = [f"memory estimate (MB; ranks on one node; per rank = the largest rank; plus ~400 MB per rank for "
             f"Python, torch and MPI; data {'shared by the node' if cfg.runtime.shared_data else 'per rank'}):"]
    base_entries, base_bytes = frozen_size(flat.module)
    if base_entries:
        lines.insert(0, f"frozen base: {base_entries} parameters, {base_bytes / MB:.1f} MB, held once per node (each "
                     f"rank builds it whole first, then frees its copy); trained (the flat vector, what travels): "
                     f"{flat.dim} entries, {4 * flat.dim / MB:.2f} MB; activations are not estimated")
    rows = {n: estimate(cfg, dataset, parts, flat, algo, n) for n in counts}
    head = "  " + "kind".ljust(30) + "".join(f"{f'-n {n} rank':>12}{f'-n {n} node':>12}" for n in counts)
    lines.append(head)
    for kind in rows[counts[0]]:
        cells = "".join(f"{rows[n][kind][0] / MB:12.1f}{rows[n][kind][1] / MB:12.1f}" for n in counts)
        lines.append("  " + kind.ljust(30) + cells)
    held = {n: [v for k, v in rows[n].items() if k in IN_MEMORY] for n in counts}
    totals = "".join(f"{sum(v[0] for v in held[n]) / MB:12.1f}{sum(v[1] for v in held[n]) / MB:12.1f}" for n in counts)
    lines.append("  " + "total in memory".ljust(30) + totals)
    return lines


# -- out of memory ---------------------------------------------------------------------------------------

def is_out_of_memory(error):
    """A host MemoryError (numpy's allocation failures are MemoryErrors) or torch's out-of-memory error."""
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower())


def out_of_memory_text(error, rank):
    """One line for a rank that ran out of memory: the error, this rank's peak memory, the node's memory now,
    and where to look (the estimate, the state bound)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    where = f"rank {rank} " if rank is not None else ""
    detail = f"{type(error).__name__}: {error}".rstrip(": ")
    return (f"{where}ran out of memory ({detail}); its peak resident memory was {peak / GB:.2f} GB{_node_memory()}. "
            f"`fedmpi run CONFIG --dry-run` estimates the memory per rank and per node; per-client state can be "
            f"bounded with runtime.client_state_memory")


def _node_memory():
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        total, free = (int(info[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        return ""
    return f", and the node has {free / GB:.2f} GB of {total / GB:.2f} GB available now"


# -- before anything is allocated (--dry-run) ----------------------------------------------------------------

# SYNTHETIC's user sizes: lognormal(4, 2) + 50 (fedmpi.data.sources), whose mean is exp(4 + 2**2 / 2) + 50.
SYNTHETIC_MEAN_SAMPLES = math.exp(4 + 2 ** 2 / 2) + 50
PER_CLIENT_BYTES = 64       # per-client bookkeeping on every rank: sizes, offsets, placement, rates, counts


def synthetic_shape(cfg):
    """(input_shape, classes, train samples, test samples) of `data.name: synthetic`, by arithmetic: the
    expected sizes for lognormal users (exact with partition.samples_per_client), nothing drawn."""
    from fedmpi.data.sources import SYNTHETIC_CLASSES, SYNTHETIC_DIM

    users = cfg.partition.clients
    per_user = cfg.partition.samples_per_client or SYNTHETIC_MEAN_SAMPLES
    n_train = users * per_user
    return (SYNTHETIC_DIM,), SYNTHETIC_CLASSES, n_train, users * max(1.0, per_user / 4)


def model_size(cfg, input_shape, classes):
    """(parameters, flat entries, frozen entries) of the configured model, built on torch's `meta` device:
    shapes without storage, so model.hidden = 100000 is counted, not allocated. None where a builder cannot
    run on meta."""
    import torch

    from fedmpi.core.errors import ConfigError
    from fedmpi.core.models import BUILDERS, build_model

    try:
        with torch.device("meta"):
            module = build_model(cfg.model, input_shape, classes, cfg.lora)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return None
    except ConfigError:
        if cfg.model.name in BUILDERS:
            raise
        return None     # a plug-in model that cannot be built on meta: built for real right after, and refused there
    params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    from fedmpi.core.flat import frozen_buffer_names

    frozen = frozen_buffer_names(module)
    buffers = sum(b.numel() for n, b in module.named_buffers() if b.is_floating_point() and n not in frozen)
    return params, params + buffers, frozen_size(module)[0]


def preflight(cfg, dataset=None):
    """(lines, reason) of `--dry-run`'s first look, before the data set or the model are made: the least one
    rank must hold (the data, whole; the flat model and its gradient; the clients' bookkeeping), from sizes
    and shapes alone. `reason` says why that cannot fit in this node's memory (None when it can, or
    cannot be told): the dry run then prints the lines and stops instead of dying of MemoryError while
    making what it was asked to estimate. `dataset` is the loaded data set (None for synthetic, whose size
    comes from the config)."""
    if dataset is None:
        input_shape, classes, n_train, n_test = synthetic_shape(cfg)
        row = 4 * math.prod(input_shape) + 8
        data = (n_train + n_test) * row + n_train * 8          # inputs, labels, the users' index
    else:
        input_shape, classes = dataset.input_shape, dataset.num_classes
        data = sum(a.nbytes for a in (dataset.x_train, dataset.y_train, dataset.x_test, dataset.y_test))
    sizes = model_size(cfg, input_shape, classes)
    if sizes is None:
        return [], None
    params, dim, base = sizes
    model = 4 * (dim + params + base)       # a frozen base is whole on every rank while it is built
    clients = PER_CLIENT_BYTES * cfg.partition.clients
    need = data + model + clients
    lines = [f"model: {cfg.model.name}, {params} parameters ({dim} entries with buffers"
             f"{f', beside {base} frozen' if base else ''}), counted on the meta device",
             f"least memory of one rank (MB): data {data / MB:.1f}, model and gradient {model / MB:.1f}, "
             f"client bookkeeping {clients / MB:.1f}, total {need / MB:.1f}"]
    total = node_memory_bytes()
    if total is None or need <= total:
        return lines, None
    biggest = max((("the data", data, "partition.clients or data.name"), ("the model", model, "the model's size "
                    "keys (model.hidden, ...)"), ("the clients' bookkeeping", clients, "partition.clients")),
                  key=lambda item: item[1])
    return lines, (f"not feasible: one rank would hold at least {need / GB:.1f} GB ({biggest[0]} alone "
                   f"{biggest[1] / GB:.1f} GB), more than this node's {total / GB:.1f} GB of memory; reduce "
                   f"{biggest[2]}")
