"""Straight-line assembly of a round's parts that the experiment builds from values (docs/explanation/design.md §5):
which transport carries the uploads, given the algorithm's declaration, the upload path and the robust
settings, each decided by fedmpi.run.resolve before anything is built; which observers report figures."""

from __future__ import annotations

import torch

from fedmpi.algorithms.base import BUFFER, GATHER, ROUTE
from fedmpi.core.train import ServerTrainer
from fedmpi.round.observers import ClientDrift, GradientDiversity, TriggeredAccuracy
from fedmpi.round.protocols import Buffer, Gather, Reduce, SecureReduce
from fedmpi.round.robust_gather import ChunkedGather
from fedmpi.round.route import Route


def build_transport(algo, clients, wire, path, *, participation, comm, server, gather, client_drift):
    """The run's transport: the chunked gather where `gather` (GatherSettings) is set, else the algorithm's
    family, REDUCE secured where an upload stage carries the update itself (secure aggregation).
    `participation`: the provider (GATHER's settle, ROUTE's past plans); `server`: rank 0's Server (None
    elsewhere); `client_drift`: eval.client_drift (REDUCE keeps the round's updates for the cosines)."""
    if gather is not None:
        return ChunkedGather(algo, clients, wire, path, gather, server)
    if algo.protocol == GATHER:
        return Gather(algo, clients, wire, path, participation, server)
    if algo.protocol == ROUTE:
        return Route(algo, clients, wire, path, participation, comm)
    if algo.protocol == BUFFER:
        return Buffer(algo, clients, wire, path)
    drift = ClientDrift(len(clients.parts), client_drift, wire.comm, wire.share)
    carrier = path.carrier()
    if carrier is not None:
        return SecureReduce(algo, clients, wire, path, drift, carrier)
    return Reduce(algo, clients, wire, path, drift)


def build_observers(transport, dim, shadow=None, triggered=None) -> tuple:
    """The round's observers, in the order they report: the gradient diversity where the transport's sums are
    the clients' weighted updates, the backdoor's success rate on the `triggered` evaluation, the divergence
    `shadow` (rank 0 under eval.divergence), the clients' cosines (REDUCE under eval.client_drift: the
    transport's drift measurements). The same collective observers, in the same order, on every rank."""
    observers = [GradientDiversity(dim)] if transport.drift_figures else []
    if triggered is not None:
        observers.append(TriggeredAccuracy(triggered))
    if shadow is not None:
        observers.append(shadow)
    drift = getattr(transport, "drift", None)
    if drift is not None and drift.keep:
        observers.append(drift)     # last: sharing the aggregate overwrites the workers' shared model
    return tuple(observers)


def server_trainer(flat, data, server_idx, *, client, seed, loss=None, evaluated=None):
    """Training on the server's own set (`server_idx` into the training set; None where it is empty) with the
    clients' settings (the `client` section) and the run's `seed`: an algorithm's pretraining or server
    learning, or FLTrust's server update. `evaluated`: eval.batch_size where the trainer also evaluates on the
    test set (an algorithm's warm-up target), None otherwise."""
    if server_idx is None or not len(server_idx):
        return None
    idx = torch.from_numpy(server_idx).to(flat.device)
    if evaluated is None:
        return ServerTrainer(flat, client, *data.train, idx, seed, loss=loss)
    return ServerTrainer(flat, client, *data.train, idx, seed, loss=loss, test=data.test, eval_batch=evaluated)
