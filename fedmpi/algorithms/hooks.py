"""The base class every algorithm subclasses (`Algorithm`: its declared capabilities and default hooks), the
keys dataclass every algorithm's `Keys` extends, and `ClientRun`, what a worker knows about one client's
training in a round. fedmpi.algorithms.base describes the whole contract and re-exports these names; the
protocol families built on `Algorithm` are in fedmpi.algorithms.families."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedmpi.algorithms.context import AlgorithmContext, SetupContext
from fedmpi.algorithms.state import ClientVectors, ServerVectors
from fedmpi.core.config_checks import Checks
from fedmpi.core.errors import ConfigError
from fedmpi.core.lazy import torch

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
    # The round's update is the weighted mean of the reduced sums (sums / weight, FedAvg's aggregate), applied by
    # the server optimizer with nothing after it: the server may then fuse the mean into the optimizer's step
    # (ServerOptimizer.step_on_mean). FedAvg works it out for itself and its subclasses.
    update_is_the_mean: ClassVar[bool] = False
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
    def prepare_model(cls, keys, module):
        """Changes the freshly built model (`module`, an nn.Module) before it is flattened, on every rank alike
        (it must depend on `keys` and the module only): FFA-LoRA freezes its A matrices, FLoRA adds the buffers
        it merges the clients' products into. Called right after the model is built, wherever one is built
        (set-up, --dry-run, the sweep's and memory's descriptions). Default: nothing."""
        return None

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
    def form(cls, keys):
        """The class that runs these keys: an algorithm with several forms picks one here (gated SAFL, IFCA's
        k cluster models), so that the resolve step reads the declarations (protocol, vector counts) of what
        will run, before anything is built."""
        return cls

    @classmethod
    def create(cls, keys, context: AlgorithmContext):
        """The instance for these keys, of the class `form` picks."""
        return cls.form(keys)(keys, context)

    @classmethod
    def client_count(cls, keys, num_clients) -> int:
        """How many clients it trains for partition.clients = `num_clients` (central: one, the union), the
        count `clients` returns, known from the keys alone."""
        return num_clients

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
