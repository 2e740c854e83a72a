"""The deployment's participation provider (fedmpi.plans.base): round plans under availability,
dropout, stragglers on the simulated clock, deadlines and over-selection (docs/how-to/deployment.md, section 6).

Every rank computes the same plan from the config, the seed, the round and the simulated time at which
the round starts; that time is the provider's state (`/participation/sim_time_s` in checkpoints, loaded
on every rank), so a resumed run continues on the same clock. Under SAFL's gating a gated-out client
uploads nothing and is done earlier: once the server has gathered who uploaded, it tells every rank
(`settle`), and the round's duration is recomputed with those clients' upload bytes at 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmpi.algorithms.base import GATHER
from fedmpi.core.train import schedule
from fedmpi.deploy.checks import configured
from fedmpi.deploy.digests import check_digests, trace_digests
from fedmpi.deploy.plan import Deployment
from fedmpi.deploy.stage import upload_bytes
from fedmpi.plans.base import Participation, RoundPlan


@dataclass
class DeployedPlan(RoundPlan):
    start: float = 0.0              # simulated seconds at which the round starts (after waiting for clients)
    end: float = 0.0                # when the server moves on: the next round's start, /metrics/sim_time_s
    returned: np.ndarray | None = None   # bool per `selected`: False if the client dropped out


class DeployParticipation(Participation):
    """Plans by `fedmpi.deploy.plan.Deployment`; the simulated clock is its state."""

    reads = ("seed", "partition", "server", "clients", "client", "secagg")

    @classmethod
    def build(cls, setting, *, seed, partition, server, clients, client, secagg):
        """The provider where a deployment key is set (`configured`); None otherwise (today's plans, untouched)."""
        if not configured(clients, server, client):
            return None
        return cls(setting.algo, setting.part_sizes, seed=seed, partition=partition, server=server, clients=clients,
                   client=client, secagg=secagg)

    def __init__(self, algo, part_sizes, *, seed, partition, server, clients, client, secagg):
        super().__init__(algo, seed=seed, num_clients=partition.clients, clients_per_round=server.clients_per_round)
        self.clients = clients
        self.deployment = Deployment(clients, server.straggler_policy(), seed, len(part_sizes),
                                     server.clients_per_round)
        self.steps = np.array([schedule(client, n).steps for n in part_sizes], dtype=np.float64)
        self.bytes_down = algo.down_vectors * algo.dim * 4
        self.bytes_up = upload_bytes(client, server, secagg, algo)
        self.gated = algo.protocol == GATHER
        self.digests = trace_digests(clients)
        self.sim_time = 0.0
        self._kept = {}                 # round -> the clients whose updates counted (`counted`)

    def plan(self, t) -> DeployedPlan:
        d = self.deployment.plan(t, self.sim_time, self.steps, self.bytes_down, self.bytes_up)
        selected = np.asarray(self.algo.select(t, d.selected, self.algo.sizes))
        n = self.deployment.num_clients
        columns = {name: np.isin(np.arange(n), cids).astype(np.float32)
                   for name, cids in (("dropped", d.outcome.failed), ("late", d.outcome.late))}
        return DeployedPlan(t, d.selected, selected, counted=np.isin(selected, d.outcome.kept),
                            metrics={"sim_time_s": d.end, "returned": int(d.returned.sum())}, columns=columns,
                            start=d.start, end=d.end, returned=np.isin(selected, d.selected[d.returned]))

    def settle(self, plan, comm, uploaders):
        """GATHER rounds, every rank: the server's uploaders (client ids; None elsewhere) reach every rank,
        and gated-out clients' upload time leaves the round's duration."""
        if not self.gated:
            return
        mask = np.zeros(len(plan.selected), dtype=np.float64)
        if uploaders is not None:
            mask[:] = np.isin(plan.selected, list(uploaders))
        comm.bcast(mask)
        gated_out = plan.counts_mask() & (mask == 0)     # answered, uploaded nothing: done at t_fail
        up = np.where(gated_out, 0, self.bytes_up)
        outcome = self.deployment.outcome(plan.selected, plan.returned, self.steps[plan.selected],
                                          self.bytes_down, up)
        plan.end = plan.start + outcome.duration
        plan.metrics["sim_time_s"] = plan.end

    def counted(self, t, cid) -> bool:
        """For FedSkip's slot weights over a period: under `availability: always` (which FedSkip requires) a
        round's outcome does not depend on when it starts, so any past round's is recomputed here."""
        if t not in self._kept:
            if len(self._kept) > 64:
                self._kept.clear()
            self._kept[t] = set(self.deployment.plan(t, self.sim_time, self.steps, self.bytes_down,
                                                     self.bytes_up).outcome.kept.tolist())
        return int(cid) in self._kept[t]

    def done(self, plan):
        self.sim_time = plan.end

    def state(self) -> dict:
        return {"sim_time_s": np.array([self.sim_time], dtype=np.float64), **self.digests}

    def load_state(self, state: dict):
        if "sim_time_s" in state:
            self.sim_time = float(np.asarray(state["sim_time_s"]).reshape(-1)[0])
        check_digests(self.clients, state)
