"""Which deployment settings an algorithm can run, checked on every rank before anything is written.

Each refusal is a ConfigError naming the key, its value and why (docs/how-to/deployment.md, section 7): an
algorithm without a federation of clients (central) takes none of them; compression applies to the
uploads of REDUCE algorithms; over-selection needs interchangeable uploads; FedSkip's slots need S
clients every round; FedBuff has no rounds to set a deadline on and starts clients at arrival events.
"""

import dataclasses

from fedmpi.algorithms.base import BUFFER, GATHER, REDUCE, ROUTE
from fedmpi.core.config_checks import Checks
from fedmpi.deploy.keys import ClientsConfig

# What each protocol is, for the messages.
_WHY = {
    ROUTE: "moves model slots from client to client (protocol route)",
    GATHER: "gates its uploads after training (protocol gather)",
    BUFFER: "buffers asynchronous uploads on the simulated clock (protocol buffer)",
}


def configured(clients, server, client) -> bool:
    """Whether any deployment key of the `clients`, `server` and `client` sections differs from its default
    (else the round loop is today's, untouched)."""
    return (clients != ClientsConfig() or server.deadline is not None or bool(server.over_select)
            or client.compress.name != "none")


def _changed(section, default):
    """(key, value) of the fields of a config section that differ from `default`."""
    return [(f.name, getattr(section, f.name)) for f in dataclasses.fields(section)
            if getattr(section, f.name) != getattr(default, f.name)]


def check(cfg, algo, num_clients):
    """Raises ConfigError for deployment keys that `algo` (an Algorithm instance, whose `protocol` reflects
    its form, e.g. gated SAFL) cannot run; `num_clients` is how many clients it trains (central: 1)."""
    c = Checks("")
    name, proto = cfg.algorithm.name, algo.protocol
    server, compress = cfg.server, cfg.client.compress
    if num_clients != cfg.partition.clients:
        why = (f"algorithm.name = {name!r} trains {num_clients} pseudo-client(s), not a federation: it has no "
               f"clients to make unavailable, slow or compressed; remove this key")
        for key, value in _changed(cfg.clients, ClientsConfig()):
            c.require(False, f"clients.{key}", value, why)
        c.require(server.deadline is None, "server.deadline", server.deadline, why)
        c.require(not server.over_select, "server.over_select", server.over_select, why)
        c.require(compress.name == "none", "client.compress.name", compress.name, why)
        c.done()
    c.require(compress.name == "none" or proto == REDUCE, "client.compress.name", compress.name,
              f"compression applies to the uploads of reduce algorithms; algorithm.name = {name!r} "
              f"{_WHY.get(proto, '')}: use name: none")
    c.require(not server.over_select or proto == REDUCE, "server.over_select", server.over_select,
              f"keeping the first clients_per_round uploads needs interchangeable uploads; algorithm.name = "
              f"{name!r} {_WHY.get(proto, '')}: use null")
    c.require(proto != ROUTE or cfg.clients.availability == "always", "clients.availability",
              cfg.clients.availability, f"algorithm.name = {name!r} trains clients_per_round model slots every "
              f"round, so every client must be available: use always (dropout and server.deadline apply)")
    c.require(proto != BUFFER or server.deadline is None, "server.deadline", server.deadline,
              f"algorithm.name = {name!r} has no synchronous rounds to end at a deadline: stragglers only arrive "
              f"later, with more staleness; use null")
    c.require(proto != BUFFER or cfg.clients.availability != "bernoulli", "clients.availability",
              cfg.clients.availability, f"algorithm.name = {name!r} starts clients at arrival events, not "
              f"rounds, where a per-round draw has no meaning: use always or trace")
    c.done()
