"""Which runs can be counterfactuals, checked at set-up with the rest of the config (fedmpi.run.resolve).

A counterfactual must differ from its original in the declared clients and in nothing else, and
tests/test_counterfactual_mpi.py proves that bit for bit for the algorithms whose uploads meet in one sum
(REDUCE). The other families are refused with the reason:
- ROUTE (FedSkip) moves each model from client to client inside a period: the clients after a dropped one
  would train from another model, so the run would differ in more than that client's upload;
- GATHER (SAFL) and BUFFER (FedBuff) deliver uploads by their own paths (the gate's masked gather, the
  simulated arrivals), which the exactness test does not cover.
Removing a client redraws the standard selection; a provider that plans rounds its own way (the deployment's
clock, Poisson sampling, FedBuff's arrivals, a plug-in) is refused with `remove` (use `drop`).
"""

from __future__ import annotations

from fedmpi.algorithms.base import REDUCE
from fedmpi.deploy.checks import configured

WHY_NOT = {
    "route": "routes each model from client to client within a period, so the clients after a dropped one would "
             "train from another model",
    "gather": "delivers uploads through its gate's masked gather, which the counterfactual's exactness test "
              "does not cover",
    "buffer": "delivers uploads at their simulated arrivals, which the counterfactual's exactness test does not "
              "cover",
}


def problems(cfg, algo) -> list:
    """One line per reason `cfg`'s counterfactual cannot be exact (empty at the section's defaults)."""
    cf = cfg.counterfactual
    if cf.inert:
        return []
    found = []
    if algo.protocol != REDUCE:
        why = WHY_NOT.get(algo.protocol, f"uses the {algo.protocol} protocol")
        found.append(f"counterfactual: algorithm.name = {cfg.algorithm.name!r} {why}; counterfactual runs take "
                     f"algorithms whose uploads meet in one sum (fedavg and most others)")
    if cf.remove:
        own = [why for why, on in (
            ("the deployment's keys (clients, server.deadline, server.over_select, client.compress)",
             configured(cfg.clients, cfg.server, cfg.client)),
            ("server.sampling: poisson", cfg.server.sampling == "poisson"),
            (f"participation.name = {cfg.participation.name!r}", cfg.participation.name is not None)) if on]
        if own:
            found.append(f"counterfactual.remove = {list(cf.remove)}: the rounds are planned by {own[0]}, which a "
                         f"removed client cannot be taken out of; use counterfactual.drop (selection unchanged)")
    return found
