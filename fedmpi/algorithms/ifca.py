"""IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020).

The server keeps k cluster models and broadcasts them together. Each selected client computes the loss of
every cluster model on its own training data, picks the lowest (ties: the lowest index), trains that one
as FedAvg trains the global model and uploads its weighted update into that cluster's slot; the per-slot
weights travel as k extra sums. Each cluster model with uploads becomes the weighted mean of its clients'
trained models (the paper's model averaging, Algorithm 2); a cluster nobody chose keeps its model.

Cluster 0 is the run's global model `x` (the one the global test set evaluates and /model/global stores);
clusters 1..k-1 start from fresh draws of the model's own initialisation under the torch seed
(seed, INIT, INIT_KEY, j) (fedmpi.algorithms.reinit.fresh_init), so they are distinct, reproducible and the
same on every rank. With k = 1 no loss is evaluated and IFCA is FedAvg, bit for bit. The paper draws every
cluster model at random independently; PFLlib has no IFCA (docs/explanation/baselines.md).

Each client's latest choice is kept in its ClientVectors (`cluster`) and logged per round in
/clients/cluster; /metrics/cluster_share is each cluster's share of the round's upload weight. A client's
local evaluation (eval_start) uses its latest cluster: cluster 0 is the updated global model; a cluster
j >= 1 is read from the round's broadcast, i.e. as it was at the round's start (the workers never see the
other clusters' new models before the next broadcast). A client that never trained is evaluated on cluster 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys, Reduce
from fedmpi.algorithms.catalog import check_declarations, register
from fedmpi.algorithms.layers import refuse_personal_entries
from fedmpi.algorithms.reinit import fresh_init
from fedmpi.algorithms.state import ClientVectors, ServerVectors
from fedmpi.core.config_checks import Checks, Range
from fedmpi.core.lazy import torch

MAX_CLUSTERS = 100
INIT_KEY = 24      # (seed, INIT, INIT_KEY, j): cluster j's initialisation (j >= 1)


@dataclass(frozen=True)
class IfcaKeys(AlgorithmKeys):
    name: str = "ifca"
    k: int = 2
    """Number of cluster models (>= 1; 1 is FedAvg)."""

    # Every rank holds k models and each selected client evaluates all k every round; the paper uses 2 to 10.
    RANGES: ClassVar[dict] = {"k": Range(1, MAX_CLUSTERS, "the number of cluster models")}


def choose_cluster(losses) -> int:
    """The cluster of lowest training loss (the first of equal ones)."""
    return int(np.argmin(np.asarray(losses, dtype=np.float64)))


def cluster_means(up_sum, dim, k):
    """[(j, weighted mean update of cluster j)] for every cluster with upload weight > 0 (float64), from the
    reduced sums: k weighted update vectors, then the k per-cluster weights."""
    weights = up_sum[k * dim: k * dim + k]
    return [(j, up_sum[j * dim:(j + 1) * dim] / float(weights[j])) for j in range(k) if float(weights[j]) > 0]


@register
class Ifca(Reduce):
    name = "ifca"
    Keys = IfcaKeys
    keeps_client_state = True        # each client's latest cluster (personalized evaluation)
    uses_server_optimizer = False    # each cluster becomes its mean: x + mean update, no server step size
    client_columns = ("cluster",)
    down_vectors = up_vectors = up_scalars = 2   # k, set per instance's class by `create`

    _by_k: dict = {}

    @classmethod
    def form(cls, keys):
        """The class whose declared vector counts match keys.k (down k models, up k slots and k weights)."""
        k = keys.k
        if k not in cls._by_k:
            cls._by_k[k] = check_declarations(type(f"Ifca{k}", (cls,), {
                "down_vectors": k, "up_vectors": k, "up_scalars": k, "__doc__": f"IFCA with k = {k} cluster models."}))
        return cls._by_k[k]

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        c = Checks("server")
        c.require(cfg.server.lr == 1.0 and cfg.server.lr_schedule.name == "constant", "lr", cfg.server.lr,
                  "ifca replaces each cluster model by the mean of its clients' models (no server step size); "
                  "use server.lr = 1.0 with a constant server.lr_schedule")
        c.done()
        refuse_personal_entries(cfg, "ifca loads whole cluster models for each client")

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        return ["each client's cluster choice (its upload slot and the per-cluster weights) is neither clipped "
                "nor noised"]

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.k = int(keys.k)
        self.server = ServerVectors(clusters=(self.k - 1) * self.dim)   # clusters 1..k-1 (cluster 0 is x)
        self.chosen = ClientVectors("cluster", length=1, within=(0, self.k - 1), whole=True)   # latest choice
        self._slot = {}          # cid -> its chosen cluster this round (between training and accumulate)
        self._share = np.zeros(self.k)
        self._down = None        # the round's broadcast on a hosting rank (its cluster models, for eval_start)
        if self.k > 1:
            self.round_start = self._keep_broadcast

    def setup(self, ctx):
        super().setup(ctx)
        if self.k > 1:
            if ctx.model is None:
                raise ValueError("ifca's set-up needs the rank's model (SetupContext.model) for its cluster draws")
            clusters = self.server.get("clusters", "cpu")
            for j in range(1, self.k):
                clusters[(j - 1) * self.dim: j * self.dim].copy_(fresh_init(ctx.model, self.context.seed,
                                                                            INIT_KEY, j).cpu())

    def cluster(self, down, j):
        """Cluster j's model in the broadcast."""
        return down[j * self.dim:(j + 1) * self.dim]

    # -- server ---------------------------------------------------------------------------------
    def down_payload(self, x, out):
        out[: self.dim].copy_(x)
        if self.k > 1:
            out[self.dim:].copy_(self.server.get("clusters", x.device))

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        dim, k = self.dim, self.k
        self._share = (up_sum[k * dim: k * dim + k] / weight_sum).cpu().numpy()
        update = None
        for j, mean in cluster_means(up_sum, dim, k):
            if j == 0:
                update = mean
            else:
                model = self.server.get("clusters", x.device)[(j - 1) * dim: j * dim]
                model.add_(mean.to(model.dtype))
        return update

    def round_metrics(self):
        return {"cluster_share": np.asarray(self._share, dtype=np.float64)} if self.k > 1 else {}

    # -- client ---------------------------------------------------------------------------------
    def local_training(self, run, down, model, local):
        j = 0
        if self.k > 1:
            losses = []
            for i in range(self.k):
                model.load(self.cluster(down, i))
                losses.append(local.loss())
            j = choose_cluster(losses)
            model.load(self.cluster(down, j))
        self._slot[run.cid] = j
        self.chosen[run.cid] = torch.tensor([float(j)])
        run.figures["cluster"] = float(j)
        return local.train()

    def _keep_broadcast(self, round_, down):
        self._down = down

    def eval_start(self, run, down, model):
        """The client's latest cluster model (cluster 0, the global model, where it has none)."""
        chosen = self.chosen.get(run.cid)
        j = 0 if chosen is None else int(chosen[0])
        model.load(down[: self.dim] if j == 0 or self._down is None else self.cluster(self._down, j))

    def accumulate(self, run, down, model, acc):
        j, w = self._slot.pop(run.cid), run.weight
        acc[j * self.dim:(j + 1) * self.dim].add_(model.vec - self.cluster(down, j), alpha=w)
        acc[self.k * self.dim + j] += w
        return w
