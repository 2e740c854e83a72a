"""MOON, model-contrastive FL (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021).

Local loss CE + mu * l_con with
    l_con = -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) ),
z the projection-head output of the model being trained, z_glob that of the round's global model x_t and
z_prev that of the client's previous local model, sim the cosine similarity. The server rule is FedAvg's.

Model convention: `module.forward_rep(x)` returns `(z, logits)` (simple_cnn, or resnet18 with model.projection
set).
The global and previous models are two frozen copies of the rank's model, built once per rank and loaded
in place per client (no deepcopy per client), in eval mode as in the reference code.

A client that has not trained before has no previous model (`first_round`):
  zero_gradient  z_prev = z_glob: l_con is the constant log 2 with zero gradient, so the client trains on
                 cross-entropy alone, as every client does in the reference codes' round 0 (no negative
                 pair yet); fedmpi's default
  x0             the previous model is x_0, the initial global model (NIID-Bench's MOON, where a client's
                 net stays the initial model until it first trains)
  model_init     from round 1 on, the previous model is the client's own never-trained network (MOON's own
                 code, whose clients' nets each have their own random initialisation): a fresh draw of the
                 model's initialisation from (seed, INIT, INIT_KEY, client) (fedmpi.algorithms.reinit);
                 round 0 has no negative pair, as there.
At full participation only round 0 has such clients, where all three train alike.
"""

import copy
from dataclasses import dataclass
from typing import ClassVar, Literal

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg
from fedmpi.algorithms.reinit import fresh_init
from fedmpi.algorithms.state import ClientVectors
from fedmpi.core.config_checks import Checks, Range, factor
from fedmpi.core.flat import FlatModel
from fedmpi.core.lazy import F, torch

INIT_KEY = 31     # (seed, INIT, INIT_KEY, client): a client's never-trained network (first_round: model_init)

def contrastive_loss(z, z_glob, z_prev, tau):
    """l_con averaged over the batch: cross-entropy over the two similarities with z_glob as the positive."""
    sims = torch.stack((F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)), dim=1)
    positive = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(sims / tau, positive)


def frozen_copy(model):
    """A FlatModel over a copy of `model.module` with gradients off, in eval mode."""
    flat = FlatModel(copy.deepcopy(model.module), model.device)
    flat.module.requires_grad_(False)
    flat.module.eval()
    return flat


@dataclass(frozen=True)
class MoonKeys(AlgorithmKeys):
    name: str = "moon"
    mu: float = 1.0
    """Weight of the model-contrastive loss (>= 0; 0 is FedAvg)."""
    tau: float = 0.5
    """Temperature of the contrastive softmax (> 0)."""
    first_round: Literal["zero_gradient", "x0", "model_init"] = "zero_gradient"
    """The previous model of a client that has not trained yet: none (zero-gradient term), x_0 (NIID-Bench)
    or the client's own never-trained network (MOON's code)."""

    RANGES: ClassVar[dict] = {"mu": factor(),
                              # the contrastive logits are cosines / tau: beyond [0.01, 100] they saturate or vanish
                              "tau": Range(0.01, 100)}


@register
class Moon(FedAvg):
    name = "moon"
    Keys = MoonKeys
    vectorizable = False
    keeps_client_state = True

    @classmethod
    def check(cls, cfg, model):
        super().check(cfg, model)
        if not model.forward_rep:
            m = cfg.model
            c = Checks("model")
            c.require(False, "name", m.name,
                      f"algorithm.name = 'moon' needs a model with a projection head (forward_rep); "
                      f"model.name = {m.name!r} with model.projection = {m.projection!r} has none: use "
                      f"model.name = simple_cnn or resnet18 with model.projection set (e.g. 256)")
            c.done()

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.mu, self.tau = float(self.keys.mu), float(self.keys.tau)
        self._prev = ClientVectors("prev", length=self.dim)   # previous local model (flat vector) on the hosting rank
        self._global_net = None    # frozen copies, built at the first client on this rank
        self._prev_net = None
        self._model = None         # the FlatModel being trained
        self._has_prev = False
        self.x0 = None             # first_round: x0

    def setup(self, ctx):
        super().setup(ctx)
        self.x0 = ctx.x0

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        if self._global_net is None:
            self._global_net, self._prev_net = frozen_copy(model), frozen_copy(model)
        self._model = model
        self._global_net.load(down[: self.dim])
        prev = self._prev.on(run.cid, model.device)
        if prev is None:
            prev = self.first_previous(run, model)
        self._has_prev = prev is not None
        if self._has_prev:
            self._prev_net.load(prev)

    def first_previous(self, run, model):
        """The previous model of a client that has not trained yet (`first_round`), or None."""
        mode = self.keys.first_round
        if mode == "x0":
            return self.x0.to(model.device)
        if mode == "model_init" and run.round > 0:
            return fresh_init(model, self.context.seed, INIT_KEY, run.cid)
        return None

    def loss_fn(self, xb, yb):
        z, logits = self._model.module.forward_rep(xb)
        with torch.no_grad():
            z_glob = self._global_net.module.forward_rep(xb)[0]
            z_prev = self._prev_net.module.forward_rep(xb)[0] if self._has_prev else z_glob
        return F.cross_entropy(logits, yb) + self.mu * contrastive_loss(z, z_glob, z_prev, self.tau)

    def accumulate(self, run, down, model, acc):
        w = super().accumulate(run, down, model, acc)
        prev = self._prev.get(run.cid)
        if prev is None or prev.device != model.vec.device:
            self._prev[run.cid] = model.vec.clone()
        else:
            prev.copy_(model.vec)
        return w
