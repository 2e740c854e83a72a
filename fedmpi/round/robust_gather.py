"""The chunked gather: a protocol family for robust aggregation over every counted client's update.

The round trains like REDUCE. Each counted client's update u_i = model - x_t (after the upload stages'
transform) stays on the rank that hosts it for the round, as float32 (a worker holds at most its own
clients' rows). Then, instead of one Reduce of the weighted sum, every rank walks the same chunk schedule:
for each pass the aggregator declared and each chunk [lo, hi) of coordinates, one Gatherv brings the counted
clients' rows of that chunk to rank 0 (`Comm.gather_rows`), where they are put in client-id order (so that
nothing depends on -n), an omniscient attack replaces the malicious rows, and the rule (fedmpi.robust.rules)
visits the chunk. Rank 0 thus holds one chunk of the S x d matrix at a time, sized from runtime.gather_memory
(fedmpi.robust.chunks); the width goes out from rank 0 each round with a one-number broadcast, so every rank
cuts the same chunks whatever its own memory. The statistics and per-client figures still travel in the
round's one reduction (without the sums); the rule's update then takes the place of the weighted mean:
the wire's sums become (update, weight 1), which the algorithm's aggregate (a weighted mean, as its
`robust_aggregation` declares) returns unchanged to the server optimizer.

A round with no counted client keeps x. Krum, Multi-Krum and Bulyan lower f for a round with too few
counted clients (fedmpi.robust.rules.krum_f, bulyan_f), the trimmed mean its trim; the round's figures
say how the rule weighted each client (/clients/robust_weight) and, for rules that exclude clients, how
well the exclusions matched the malicious set (/metrics/detect_precision, detect_recall, honest_excluded).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.attacks.omniscient import OmniscientAttack
from fedmpi.core.train import schedule
from fedmpi.mpi.runtime import place_clients
from fedmpi.robust.chunks import BLOCK, chunk_bounds, chunk_width
from fedmpi.robust.driver import aggregate_chunks, total_passes
from fedmpi.round.protocols import Combined, LocalPart, Reduce, Transport

DETECTION = ("detect_precision", "detect_recall", "honest_excluded")


@dataclass(frozen=True)
class GatherSettings:
    """What the family is configured with (not state: the same every round)."""

    rule: object                    # a fedmpi.robust.rules.Rule
    budget: int                     # rank 0's bytes for a chunk (runtime.gather_memory or the machine's share)
    malicious: np.ndarray           # the run's malicious client ids (fedmpi.attacks.malicious_clients)
    attack: object = None           # cfg.attack where it is omniscient, else None
    server_trainer: object = None   # fltrust (rank 0): the server's own training (fedmpi.core.train.ServerTrainer)
    client_cfg: object = None       # fltrust: the clients' training settings the server's update repeats
    client_lr: object = None        # fltrust: round -> the clients' learning rate (LearningRate.at)
    block: int = BLOCK


class ChunkedGather(Reduce):
    name = "chunked_gather"
    drift_figures = False
    # Clients train as under REDUCE, but a round's clients are dealt to the workers from the broadcast in the
    # fixed shares of `round_hosts` (the rows' senders must be known to every rank).
    deals_as_free = False

    def __init__(self, algo, clients, wire, path, settings: GatherSettings, server=None):
        """`settings`: the rule and what it is configured with; `server` (rank 0): the Server whose global
        model FLTrust's server update starts from."""
        Transport.__init__(self, algo, clients, wire, path)
        self.settings, self.server = settings, server

    def local(self, round_, updates):
        """Keeps (client id, its update as a float32 numpy row) per counted client."""
        tally, kept, plan, down, flat = self.wire.new_tally(), [], round_.plan, round_.training.down, self.flat
        for update in updates:
            if plan.counts(update.cid):
                weight, update = self.upload(update, round_, tally.acc)
                if weight != len(self.clients.parts[update.cid]):
                    raise RuntimeError(f"client {update.cid}: upload weight {weight} is not its sample count; "
                                       f"robust aggregation weighs clients by their sample counts")
                tally.weight += weight
                tally.upload(update.bytes)
                kept.append((update.cid, (flat.vec - down[: flat.dim]).detach().to("cpu", torch.float32).numpy()))
            self.record(tally, update)
        return LocalPart(tally, kept)

    def combine(self, comm, round_, local):
        _, stats = self.reduce(local.tally, sums=False)   # statistics and figures; the rows go chunk by chunk
        clients, s, plan = self.clients, self.settings, round_.plan
        host, dim = round_hosts(clients, plan.selected), self.flat.dim
        counted = sorted(int(c) for c in plan.selected if plan.counts(c))
        mine = sorted(local.kept, key=lambda k: k[0])
        if [c for c, _ in mine] != [c for c in counted if host[c] == comm.rank]:
            raise RuntimeError(f"rank {comm.rank}: trained counted clients {[c for c, _ in mine]} differ from the "
                               f"plan's hosted counted clients")
        rows_by_rank = [sum(1 for c in counted if host[c] == r) for r in range(comm.size)]
        n = len(counted)
        is_malicious = np.isin(counted, s.malicious)
        attack = OmniscientAttack(s.attack, is_malicious, s.block) if s.attack is not None else None
        width = self._width(comm, n, dim) if n else 0
        rows = [row for _, row in mine]

        def send(lo, hi):
            block = np.stack([r[lo:hi] for r in rows]) if rows else np.empty((0, hi - lo), dtype=np.float32)
            return comm.gather_rows(block, rows_by_rank, hi - lo)

        if not comm.is_server:
            for _ in range(total_passes(s.rule, attack) if n else 0):
                for lo, hi in chunk_bounds(dim, width):
                    send(lo, hi)
            return Combined()
        update, weights = None, np.zeros(0)
        if n:
            in_rank_order = [c for r in range(comm.size) for c in counted if host[c] == r]
            order = np.argsort(in_rank_order, kind="stable")

            def source(lo, hi):
                return send(lo, hi)[order]

            w = np.array([len(clients.parts[c]) for c in counted], dtype=np.float64)
            g0 = self._server_update(plan.round) if s.rule.needs_server_update else None
            outcome = aggregate_chunks(s.rule, source, w, dim, width, block=s.block, attack=attack,
                                       server_update=g0)
            update, weights = outcome.update, outcome.weights
        # The rule's update takes the place of the weighted mean: (update, weight 1), which the algorithm's
        # aggregate (a weighted mean, as its `robust_aggregation` declares) returns unchanged.
        sums = torch.zeros(self.wire.up_len, dtype=torch.float64)
        if update is not None:
            sums[:dim] = torch.from_numpy(update)
        sums = sums.to(self.flat.device)
        metrics, columns = self._figures(counted, weights, is_malicious)
        return Combined(sums, 1.0 if update is not None else 0.0, stats, metrics, columns)

    def _width(self, comm, n, dim):
        """The round's chunk width: rank 0's, from its budget, sent to every rank (one number)."""
        buf = np.zeros(1, dtype=np.int64)
        if comm.is_server:
            buf[0] = chunk_width(self.settings.budget, n, dim, self.settings.block)
        comm.bcast(buf)
        return int(buf[0])

    def _server_update(self, t):
        """FLTrust's g0: the clients' local training repeated on the server's set from x_t, minus x_t."""
        s, x = self.settings, self.server.x
        trainer, client = s.server_trainer, s.client_cfg
        steps = schedule(client, trainer.n).steps       # as many local steps as a client of the server set's size
        vec, _ = trainer.train(x, t, steps, client.batch_size, s.client_lr(t))
        return (vec.double() - x.double()).cpu().numpy()

    def _figures(self, counted, weights, is_malicious):
        """The round's /clients/robust_weight and, for rules that exclude, its detection figures."""
        num = len(self.clients.parts)
        column = np.full(num, np.nan, dtype=np.float32)
        column[counted] = weights
        metrics = {}
        if self.settings.rule.excludes:
            metrics = detection(np.asarray(weights) == 0, is_malicious)
        return metrics, {"robust_weight": column}


def round_hosts(clients, selected) -> dict:
    """{client id: the rank that trains it this round} for the round's selected clients: its host, or where
    the ClientHost deals stateless clients afresh each round (`balanced`), its share of that deal (the same
    on every rank, as ClientHost.round_clients)."""
    if not clients.balanced:
        return {int(c): int(clients.host[c]) for c in selected}
    share = place_clients([len(clients.parts[c]) for c in selected], clients.workers)
    return {int(c): int(r) for c, r in zip(selected, share)}


def detection(excluded, malicious) -> dict:
    """Detection figures of one round: precision (share of the excluded that are malicious), recall (share of
    the round's malicious that were excluded) and honest_excluded (share of the round's honest excluded);
    NaN where the share has nothing to count."""
    excluded, malicious = np.asarray(excluded, dtype=bool), np.asarray(malicious, dtype=bool)

    def share(part, whole):
        return float(part) / whole if whole else float("nan")

    hits = int((excluded & malicious).sum())
    return {"detect_precision": share(hits, int(excluded.sum())),
            "detect_recall": share(hits, int(malicious.sum())),
            "honest_excluded": share(int((excluded & ~malicious).sum()), int((~malicious).sum()))}
