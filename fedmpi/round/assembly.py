"""Straight-line assembly of a round's parts that the experiment builds from values (docs/design.md §5):
which transport carries the uploads, given the algorithm's declaration, the upload path and the robust
settings, each decided by fedmpi.run.resolve before anything is built."""

from __future__ import annotations

from fedmpi.algorithms.base import BUFFER, GATHER, ROUTE
from fedmpi.round.drift import ClientDrift
from fedmpi.round.protocols import Buffer, Gather, Reduce, Route, SecureReduce
from fedmpi.round.robust_gather import ChunkedGather


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
    drift = ClientDrift(len(clients.parts), client_drift)
    carrier = path.carrier()
    if carrier is not None:
        return SecureReduce(algo, clients, wire, path, drift, carrier)
    return Reduce(algo, clients, wire, path, drift)
