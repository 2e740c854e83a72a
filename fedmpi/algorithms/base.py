"""The algorithm contract: what an FL algorithm is, as far as the round loop is concerned.

An algorithm is a small class of hooks in the spirit of pfl-research's FedAvg. It does tensor arithmetic
only: no MPI, no files. It says what it is through declared capabilities (class attributes, checked when
it is registered, and on the instance at set-up), never through which methods it happens to override; the
round loop (`fedmpi.round`) owns all communication and calls the hooks below.

Construction: `create(keys, context)` -> `Algorithm(keys, context)`. `keys` is the algorithm's own frozen
`Keys` (the `algorithm:` section); `context` an `AlgorithmContext`: seed, num_clients, clients_per_round,
rounds, dim, n_params, `history` (`history.selected(t)`: round t's selected clients, from the participation
provider, the same on every rank), `client` (a `ClientTraining`: lr, batch_size, epochs, steps, momentum,
drop_last, lr_schedule; `context.client_lr(t)` is the round's eta_l) and `privacy_enabled`. Nothing else
of the config reaches an instance; `check(cfg, model)` sees the whole config before anything is built.

Declared capabilities (class attributes)
  name, Keys             `algorithm.name` and the frozen dataclass of its keys, beside the class (`@register`)
  protocol               how uploads travel, set by the family base: REDUCE (`Reduce`: one Reduce), ROUTE
                         (`SlotRouting`: model slots moved between ranks), GATHER (`GatedUploads`: masked Gatherv),
                         BUFFER (`BufferedUploads`: updates held until their simulated arrival, then one Reduce)
  keeps_client_state     clients keep vectors between rounds (`ClientVectors`): they train on their fixed host
  vectorizable           a round's clients may train as one batched computation: `client_start` only loads the
                         broadcast vector, no `grad_hook`/`step_hook`/`loss_fn` (neither on the class nor set
                         on the instance), `accumulate` reads only the trained vector
  uses_server_set        needs the server's own set on rank 0 (FSL's D0, data sharing's G) for `initial_model`
                         and `after_step`; a non-empty `server_set_hint` makes server_data.size > 0 a requirement
  shares_data            `clients` merges shared data into the clients' sets (logged under /partition/shared)
  uses_server_optimizer  `aggregate` returns an update that `server.optimizer` applies; False: x + update as is
  down_vectors, up_vectors, up_scalars
                         vectors per client in each direction (bytes are derived from them); extra float64
                         sums after the upload vectors in the same reduction
  client_columns         per-client figures the algorithm sets in `ClientRun.figures` (/clients/<name>)
  fixed_cohort_only      why `server.sampling: poisson` cannot run it ("" = it can; central SGD, SlotRouting)
  privacy_problems(keys, client_steps)   classmethod: why Gaussian noise on clipped updates does not make it
                         client-level DP with these keys ([] = it does; SCAFFOLD, FedSkip, central, SAFL's
                         gating and IDA fusion, FedNova under client.epochs)
  personal               fnmatch patterns over the model's parameter and buffer names (named_parameters(),
                         named_buffers()) whose entries each client keeps for itself (FedPer's head); the
                         classmethod `personal_patterns(keys, model)` returns them for given keys and model
                         (default: `personal`; FedPer reads its keys, FedBN finds the norm layers). The union with
                         the config's `model.personal` is `context.split` (see "Personal parameters" below)

Hooks, in the order of a round (rank 0 is the server; "host" is the rank that trains the client, rank 0 at -n 1)
  hook                                   when              rank    may touch
  check(cfg, model)      classmethod     before any file   every   nothing: raises ConfigError
  clients(parts, server_idx)             set-up            every   returns the index sets clients train on
  setup(ctx)                             set-up            every   its own attributes (sizes, server set, probe)
  initial_model(x0, server_trainer)      set-up            0       returns x_0 (pretraining, warm-up)
  select(round, standard, sizes)         every round       every   pure: the clients that train
  schedule(cid, sizes, selected)         per client        host    pure: (batch, steps) or None
  down_payload(x, out)                   round start       0       writes `out`, the broadcast
  round_start(round, down)               round start       host    every rank hosting clients, after the
                                         (REDUCE, GATHER,          broadcast, before training: per-client
                                         BUFFER)                   state (SAFL's end-of-round mix; None: none)
  client_start(run, down, model)         per client        host    loads the start point; per-client state
                                                                   (then the round loads the client's
                                                                   personal entries, if any)
  grad_hook(params, grad)                each local step   host    the flat gradient, in place (None: none)
  step_hook(params)                      after each step   host    the flat parameters, in place, after the
                                                                   optimizer step (None: none)
  loss_fn(xb, yb)                        each local step   host    returns the loss (None: cross-entropy)
  local_training(run, down, model, local)  per client      host    replaces the one pass of local SGD (None:
                                         (after                    one pass with the three hooks above):
                                         client_start)             `local.train(steps=None, grad_hook=None,
                                                                   loss_fn=None, step_hook=None, lr=None,
                                                                   stream=0)` runs one pass from the model's
                                                                   current vector and returns (loss_sum,
                                                                   seen); stream 0 is the client's own
                                                                   (seed, CLIENT, t, cid), FedAvg's, stream
                                                                   j >= 1 draws from (seed, PERSONAL, t, cid,
                                                                   j); `local.loss()` is the current vector's
                                                                   mean training loss; `local.steps`,
                                                                   `local.epoch_steps` the schedule's and one
                                                                   epoch's steps. It returns the figures of
                                                                   the pass that counts as the client's
                                                                   training loss and leaves the upload in
                                                                   `model`; `run.steps` stays the schedule's
                                                                   steps (`local.steps`)
  accumulate(run, down, model, acc)      after training    host    adds the upload to `acc`, returns its
                                         (REDUCE)                  weight; per-client state
  aggregate(x, up_sum, weight_sum, t)    after reduction   0       returns the update (None: keep x); server state
  eval_start(run, down, model)           local evaluation  host    loads what client run.cid is evaluated with
                                         (eval.local_every)        on its local test split; `down` is the global
                                                                   model after the round's step (`dim` entries)
  after_step(x, t)                       after optimizer   0       returns the next x (FSL's server learning)
  round_metrics()                        end of round      0       returns extra /metrics figures
  server_state() / load_server_state(s)  checkpoints       0       `ServerVectors` attributes: saved without code
  client_state(cid) / load_client_state  checkpoints       host    `ClientVectors` attributes: likewise
`grad_hook`, `step_hook`, `loss_fn`, `local_training` and `round_start` may be methods or attributes set in
`__init__` (SCAFFOLD picks its correction there); a `vectorizable` class may have none of the first four, on
the class (refused at registration) or on the instance (refused at set-up by `verify_declarations`, exit 2).
The protocol families add their own hooks: `SlotRouting` (order, is_period_start, is_aggregation,
start_slot, finish_slot, take_slot, put_slot, slot_weights, accumulate_slots), `GatedUploads` (gate,
fusion_weight), `BufferedUploads` (hold, release); see their docstrings below.

Personal parameters (issue 24). `context.split` (a fedmpi.core.personal.ParameterSplit, or None) names the
flat vector's personal entries. For a REDUCE algorithm with a split, the round loop itself (no algorithm
code needed): loads the client's own personal entries into the model right after `client_start` (a client
without any yet keeps those of the broadcast, which are x_0's: the server's copy of them never changes);
after training keeps the trained personal entries in `personal_state` (a `ClientVectors` the base class makes,
checkpointed and spilled like any other) and puts the broadcast's values back into them before the upload,
so every upload's personal entries carry no change and the client's own values never reach the wire. The
server update's personal entries are zeroed too (DP noise cannot drift them). The buffers keep their layout;
`bytes_up`/`bytes_down` count the shared entries only (`wire_dim` per vector). Clients with a split train on
their fixed host, one by one (never batched). `eval_start` defaults to the global model with the client's
personal entries. An algorithm that keeps a whole personal model (Ditto) declares its own `ClientVectors`
(and keeps_client_state) and overrides `eval_start` to load it.

Upload sums arrive as float64 (so the result does not depend on the number of ranks); the global model `x`
and the broadcast are float32. Vectors have `dim` elements (the flat model: `n_params` trainable entries,
then float buffers such as batch-norm statistics). The accumulator has `up_vectors * dim + up_scalars`
elements.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from fedmpi.algorithms.context import (
    AlgorithmContext,
    ClientTraining,
    ParticipationHistory,
    PlanHistory,
    SetupContext,
    StandardDraws,
)
from fedmpi.algorithms.state import ClientVectors, ServerVectors
from fedmpi.core.config_checks import Checks
from fedmpi.core.errors import ConfigError

# The contract's names, the context's included (defined in fedmpi.algorithms.context, imported from here by
# plug-ins written before it moved).
__all__ = ["BUFFER", "GATHER", "REDUCE", "ROUTE", "TRAINING_HOOKS", "Algorithm", "AlgorithmContext", "AlgorithmKeys",
           "BufferedUploads", "ClientRun", "ClientTraining", "GatedUploads", "ParticipationHistory", "PlanHistory",
           "Reduce", "SetupContext", "SlotRouting", "StandardDraws", "weighted_mean_update"]

REDUCE, ROUTE, GATHER, BUFFER = "reduce", "route", "gather", "buffer"
PERSONAL_STATE = "personal"     # the checkpoint name of each client's personal entries (/clients/<cid>/personal)
TRAINING_HOOKS = ("grad_hook", "step_hook", "loss_fn", "local_training")    # what batched clients cannot call


@dataclass(frozen=True)
class AlgorithmKeys:
    """Base of every algorithm's keys dataclass (the `algorithm:` section of the config)."""

    name: str = ""
    """`algorithm.name`: a registered name, an entry point of group `fedmpi.algorithms`, or `module:Class`."""


@dataclass
class ClientRun:
    """What a worker knows about one client's training this round."""

    cid: int
    round: int
    n_samples: int
    lr: float = 0.0               # the round's client learning rate (client.lr_schedule)
    weight: float | None = None   # the upload's weight in FedAvg's average (None: n_samples)
    payload_bytes: int | None = None   # what the upload costs on the wire (None: up_vectors float32 vectors)
    steps: int = 0
    loss_sum: float = 0.0         # sum of the sample losses seen in training (a 0-d tensor once trained)
    seen: int = 0                 # samples seen in training
    figures: dict = field(default_factory=dict)   # per-client figures for /clients/<name> this round


    def __post_init__(self):
        if self.weight is None:
            self.weight = float(self.n_samples)


class Algorithm(abc.ABC):
    name: ClassVar[str] = ""
    Keys: ClassVar[type] = AlgorithmKeys
    protocol: ClassVar[str] = REDUCE
    keeps_client_state: ClassVar[bool] = False
    vectorizable: ClassVar[bool] = False
    uses_server_set: ClassVar[bool] = False
    server_set_hint: ClassVar[str] = ""
    shares_data: ClassVar[bool] = False
    uses_server_optimizer: ClassVar[bool] = True
    down_vectors: ClassVar[int] = 1
    up_vectors: ClassVar[int] = 1
    up_scalars: ClassVar[int] = 0
    client_columns: ClassVar[tuple] = ()
    # Why server.sampling: poisson cannot run this algorithm ("" = it can): its rounds need the fixed-size draw
    fixed_cohort_only: ClassVar[str] = ""
    # Its upload is one vector, w_i (model - down) with w_i = run.weight, and its `aggregate` the weighted mean
    # of those: a robust aggregator (server.aggregator, fedmpi.robust) may then replace that mean. Declared, not
    # inferred: a subclass with its own aggregate or upload declares False.
    robust_aggregation: ClassVar[bool] = False
    # Its upload is the one vector w_i (model - down), whatever the server then does with the sum: secure
    # aggregation (server.secure_aggregation, fedmpi.secagg) may sum it masked. Declared, not inferred: a
    # subclass whose accumulate uploads anything else declares False.
    uploads_model_delta: ClassVar[bool] = False
    grad_hook = None     # optional callable(params, grad): a correction added to the flat gradient
    step_hook = None     # optional callable(params): a change to the parameters after each optimizer step
    round_start = None   # optional callable(round, down): on hosting ranks after each round's broadcast
    loss_fn = None       # optional callable(xb, yb): replaces the plain cross-entropy (MOON)
    # optional callable(run, down, model, local) -> (loss_sum, seen): the client's passes of local SGD in place
    # of the one pass (Ditto, FedRep, APFL, Per-FedAvg, IFCA, q-FFL); `local` is a fedmpi.round.local_passes.
    # LocalPasses. The upload is what it leaves in `model`.
    local_training = None
    # fnmatch patterns over parameter/buffer names whose entries stay with each client (`personal_patterns`)
    personal: ClassVar[tuple[str, ...]] = ()

    def __init__(self, keys, context: AlgorithmContext):
        self.keys, self.context = keys, context
        self.dim, self.n_params = context.dim, context.n_params
        self.split = context.split if context.split else None     # None when nothing is personal
        if self.split is not None:
            # Each client's personal entries, on its host; a client without any starts from the broadcast's.
            self.personal_state = ClientVectors(PERSONAL_STATE, length=self.split.personal_dim)

    @classmethod
    def personal_patterns(cls, keys, model) -> tuple:
        """The patterns of the entries this algorithm keeps personal with `keys` on `model` (a FlatModel;
        `model.entries` lists (name, offset, numel)); ConfigError, naming algorithm.name, when the model lacks
        the layers it needs. Default: the class's `personal`."""
        return tuple(cls.personal)

    @property
    def wire_dim(self) -> int:
        """Entries of each vector that travel: the shared ones (all `dim` when nothing is personal)."""
        return self.split.shared_dim if self.split is not None else self.dim

    @classmethod
    def create(cls, keys, context: AlgorithmContext):
        """The instance for these keys (an algorithm with several forms picks one here, e.g. gated SAFL)."""
        return cls(keys, context)

    # -- checks and set-up (every rank) --------------------------------------------------------------
    @classmethod
    def check(cls, cfg, model):
        """Raises ConfigError for a config this algorithm cannot run (model included), before anything is
        written. Subclasses extend it with their own conditions and call super()."""
        c = Checks("")
        if cls.server_set_hint:
            c.require(cfg.server_data.wanted, "server_data.size", cfg.server_data.size,
                      f"algorithm.name = {cfg.algorithm.name!r} needs the server's set: set server_data.size > 0 "
                      f"(or server_data.fraction > 0) "
                      f"({cls.server_set_hint})")
        if not cls.uses_server_optimizer:
            c.require(cfg.server.optimizer == "sgd", "server.optimizer", cfg.server.optimizer,
                      f"algorithm.name = {cfg.algorithm.name!r} applies its own server update; use sgd")
        c.done()

    @classmethod
    def privacy_problems(cls, keys, client_steps) -> list:
        """Why Gaussian noise on the sum of clipped per-client updates does not make this algorithm, with
        these keys, client-level differentially private as implemented, one reason each (empty: it does).
        `client_steps` is client.steps (None: the clients run epochs). fedmpi.privacy words the messages."""
        return []

    def clients(self, parts, server_idx):
        """The index sets the clients train on (central: the union as one client). Pure."""
        return parts

    def setup(self, ctx: SetupContext):
        self.sizes = np.asarray(ctx.sizes)
        self.server_idx = np.asarray(ctx.server_idx, dtype=np.int64)

    def initial_model(self, x0, server_trainer):
        """x_0 on the server; pretraining or warm-up on the server's set goes here."""
        return x0

    def select(self, round_, selected, sizes):
        """The clients that train this round, given the standard draw `selected`."""
        return selected

    def schedule(self, client, sizes, selected):
        """(batch size, steps) for a client this round; None = the client config's rule."""
        return None

    # -- server side (rank 0) --------------------------------------------------------------------------
    def down_payload(self, x: torch.Tensor, out: torch.Tensor):
        out[: self.dim].copy_(x)

    @abc.abstractmethod
    def aggregate(self, x: torch.Tensor, up_sum: torch.Tensor, weight_sum: float, round_):
        """The round's update (float64, `dim` entries) for the server optimizer, or None to keep x."""

    def after_step(self, x: torch.Tensor, round_) -> torch.Tensor:
        return x

    def round_metrics(self) -> dict:
        """Extra per-round figures for /metrics (server side), e.g. FSL's server loss."""
        return {}

    # -- client side (hosting rank) ----------------------------------------------------------------------
    def client_start(self, run: ClientRun, down: torch.Tensor, model):
        model.load(down[: self.dim])

    def eval_start(self, run: ClientRun, down: torch.Tensor, model):
        """Loads into `model` what client `run.cid` is evaluated with on its local test split (eval.local_every),
        on its host; `down` is the global model after the round's server step (`dim` entries). Default: the
        global model with the client's personal entries (where it has any). Must not change client state."""
        model.load(down[: self.dim])
        self.load_personal(run.cid, model)

    # -- personal entries (the round loop calls these where `split` is set) ---------------------------------
    def load_personal(self, cid, model):
        """Client `cid`'s own personal entries into `model` (nothing when it has none yet, or no split)."""
        if self.split is None:
            return
        mine = self.personal_state.on(cid, model.device)
        if mine is not None:
            self.split.put_personal(model.vec, mine)

    def keep_personal(self, cid, model, down):
        """After training: the trained personal entries into the client's state, and the broadcast's values
        (`down`) back into `model`'s, so that the upload carries no personal change."""
        if self.split is None:
            return
        self.personal_state[cid] = self.split.personal(model.vec.detach())
        self.split.put_personal(model.vec, self.split.personal(down))

    # -- state for checkpoints -----------------------------------------------------------------------------
    def server_state(self) -> dict:
        state = {}
        for store in self._stores(ServerVectors):
            state.update(store.state())
        return state

    def load_server_state(self, state: dict):
        for store in self._stores(ServerVectors):
            store.load(state)

    def client_state(self, cid) -> dict:
        state = {}
        for store in self._stores(ClientVectors):
            state.update(store.state(cid))
        return state

    def load_client_state(self, cid, state: dict):
        for store in self._stores(ClientVectors):
            store.load(cid, state)

    def _stores(self, kind):
        return [v for v in vars(self).values() if isinstance(v, kind)]

    def verify_declarations(self):
        """What the instance holds must match what its class declares, checked at set-up (ConfigError,
        exit 2, before any file is written): per-client vectors without `keeps_client_state` would be lost
        when its clients are dealt to other ranks; a per-instance hook on a `vectorizable` class would never
        be called, since batched clients train without hooks."""
        named = f"algorithm.name = {self.keys.name!r}"
        # The personal entries' store is the round loop's business: it trains such clients on their host.
        stores = [k for k, v in vars(self).items() if isinstance(v, ClientVectors) and k != "personal_state"]
        if stores and not self.keeps_client_state:
            raise ConfigError(f"{named}: algorithm {self.name!r} keeps per-client vectors ({', '.join(stores)}) "
                              f"but does not declare keeps_client_state = True")
        hooks = [h for h in TRAINING_HOOKS if vars(self).get(h) is not None]
        if hooks and self.vectorizable:
            cls = f"{type(self).__module__}.{type(self).__qualname__}"
            raise ConfigError(f"{named}: algorithm class {cls} declares vectorizable = True but sets "
                              f"{', '.join(hooks)} on the instance, which batched clients would never call; "
                              f"declare vectorizable = False")


def weighted_mean_update(up_sum, weight_sum, dim, out=None):
    """FedAvg's aggregate: (sum_i w_i Delta_i) / (sum_i w_i), or None when nobody uploaded. `out`, a float64
    vector of `dim` entries on up_sum's device, is reused instead of allocating a model-sized vector (a new
    one is returned when it does not fit)."""
    if weight_sum <= 0:
        return None
    if out is None or out.shape != (dim,) or out.device != up_sum.device or out.dtype != up_sum.dtype:
        out = torch.empty(dim, dtype=up_sum.dtype, device=up_sum.device)
    return torch.div(up_sum[:dim], weight_sum, out=out)


class Reduce(Algorithm):
    """Family: every selected client adds its weighted upload into one accumulator; one Reduce."""

    protocol = REDUCE

    @abc.abstractmethod
    def accumulate(self, run: ClientRun, down: torch.Tensor, model, acc: torch.Tensor) -> float:
        """Adds this client's upload to `acc` (float64); returns its weight."""


class SlotRouting(Algorithm):
    """Family: model slots persist between aggregations and move between the ranks hosting consecutive
    clients (FedSkip). Every rank derives the plan (`order`, periods, weights) from the seed itself."""

    protocol = ROUTE
    keeps_client_state = True
    fixed_cohort_only = "its model slots are laid out for exactly server.clients_per_round clients per round"

    @abc.abstractmethod
    def order(self, round_, selected):
        """The round's clients in slot order: slot j trains on order[j]."""

    @abc.abstractmethod
    def is_period_start(self, round_) -> bool:
        """Slots start from the broadcast global model this round."""

    @abc.abstractmethod
    def is_aggregation(self, round_) -> bool:
        """The slots are averaged into x at the end of this round."""

    @abc.abstractmethod
    def start_slot(self, run: ClientRun, slot, start, model):
        """Loads slot `slot` (or `start`, the period's global model, if it has none here) into `model`."""

    @abc.abstractmethod
    def finish_slot(self, run: ClientRun, slot, model):
        """Keeps the trained `model` as slot `slot`, now held by client `run.cid`."""

    @abc.abstractmethod
    def take_slot(self, slot) -> torch.Tensor:
        """Removes slot `slot` from this rank (it moves to another); returns its vector."""

    @abc.abstractmethod
    def put_slot(self, slot, vec: torch.Tensor):
        """Receives slot `slot` from another rank."""

    @abc.abstractmethod
    def slot_weights(self, round_, weight_of) -> np.ndarray:
        """Accumulated weight of every slot from the period's first round up to `round_`; `weight_of(s, cid)`
        is client cid's weight in round s (its sample count, 0 where its update did not count)."""

    @abc.abstractmethod
    def accumulate_slots(self, start, weights, acc) -> float:
        """Aggregation round: adds the slots held here into `acc`, drops them; returns their weight."""


class GatedUploads(Algorithm):
    """Family: clients decide after training whether to upload (SAFL's gating); the server gathers the
    mask, then only the uploaders' vectors (masked Gatherv), and fuses them in client-id order."""

    protocol = GATHER
    keeps_client_state = True

    @abc.abstractmethod
    def gate(self, run: ClientRun, down: torch.Tensor, model) -> bool:
        """Whether this client, whose trained vector is in `model`, uploads it."""

    @abc.abstractmethod
    def fusion_weight(self, n_samples, z: torch.Tensor, x: torch.Tensor) -> float:
        """The server's weight of an uploaded vector `z` given the current global `x`."""


class BufferedUploads(Algorithm):
    """Family: asynchronous clients on the simulated clock (FedBuff). A client trains in the round of the
    model version it starts from and holds its update until the round in which its upload arrives; the
    participation provider (fedmpi.deploy.buffered) plans who starts and who arrives, the same on every rank.
    The arrivals are added into one accumulator and reduced like REDUCE uploads."""

    protocol = BUFFER
    keeps_client_state = True

    @abc.abstractmethod
    def hold(self, run: ClientRun, down: torch.Tensor, model):
        """Keeps the update of client `run.cid`, trained from version `run.round` (the broadcast `down`)."""

    @abc.abstractmethod
    def release(self, cid, version, round_, acc: torch.Tensor) -> float:
        """Adds the held update of `cid` trained from `version`, arriving in round `round_`, to `acc`;
        returns its weight."""
