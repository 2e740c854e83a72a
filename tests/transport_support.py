"""Transports driven without a config or an Experiment: a rank's round buffers on LocalComm, a stand-in for
the client host, and hand-made ClientUpdates (tests/test_transports.py, tests/test_baselines.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from fedmpi.algorithms import ClientRun
from fedmpi.mpi.local import LocalComm
from fedmpi.plans.base import RoundPlan
from fedmpi.round.protocols import RoundInput, Training
from fedmpi.round.wire import RoundBuffers
from fedmpi.uploads.base import ClientUpdate, UploadPath


def host(model, sizes, rank=0, workers=(0,)):
    """The client host a transport reads: the rank's flat model (`model`, .vec and .dim), every client's
    samples (`sizes`: client id -> sample count) and where each lives (all on `rank`)."""
    parts = [np.arange(n) for n in sizes]
    model.dim = model.vec.numel()       # a FlatModel's length
    return SimpleNamespace(flat=model, parts=parts, host=np.full(len(parts), rank), mine=set(range(len(parts))),
                           workers=list(workers), trains=True, balanced=False)


def buffers(algo, num_clients, comm=None, up_extra=0):
    """A rank's round buffers on `comm` (LocalComm: one process, the reductions are copies)."""
    return RoundBuffers(comm or LocalComm(), algo, algo.dim, num_clients, torch.device("cpu"), False,
                        up_extra=up_extra)


def path(stages=(), algo=None):
    return UploadPath(stages, 0 if algo is None else algo.up_vectors * algo.dim + algo.up_scalars)


def round_input(t, selected, down, counted=None, stages=None, p=None):
    """Round t's RoundInput for a transport: the plan of `selected` (whose updates count per `counted`), the
    broadcast `down` as the start, and the upload path `p`'s views (none without stages)."""
    selected = np.asarray(selected)
    plan = RoundPlan(t, selected, selected, None if counted is None else np.asarray(counted))
    views = p.begin(plan) if p is not None else stages
    return RoundInput(plan, Training([int(c) for c in selected], None, down), views)


def trained(model, down, t, clients, lr=0.1, start=None):
    """Hand-made updates: each client (cid, n_samples, steps, y) starts (`start(run)`, where given) and 'trains'
    to y; yields its ClientUpdate as the engine's loop does (the model's vector a view, overwritten by the next
    client)."""
    dim = model.vec.numel()
    for cid, n, steps, y in clients:
        run = ClientRun(cid, t, n, lr=lr, steps=steps)
        if start is not None:
            start(run)
        model.vec.copy_(torch.as_tensor(y, dtype=torch.float32))
        yield ClientUpdate(cid, t, model.vec, down[:dim], run.weight, run=run)
