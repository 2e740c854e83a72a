"""The config's sections as frozen dataclasses, one per top-level key (data, partition, server_data, model,
client, server; eval, checkpoint and runtime are in fedmpi.config.run_sections, the deployment's, privacy's,
attack's and secure aggregation's beside their code in fedmpi.deploy.keys, fedmpi.privacy.keys,
fedmpi.attacks.keys and fedmpi.secagg.keys). Every field has a type and a default; each section range-checks
its own values in `__post_init__`."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar, Literal

from fedmpi.core.config_checks import Checks as _Checks
from fedmpi.core.config_checks import Range, clients_range, count, factor, refuse_unused
from fedmpi.core.errors import ConfigError
from fedmpi.core.schedules import ScheduleConfig
from fedmpi.deploy.keys import CompressConfig, DeadlineConfig
from fedmpi.robust.keys import RobustConfig, aggregator_problems


# The names a section may take come from the registries that implement them, so that a new data source,
# partition scheme, model, algorithm or server optimizer is one registration, not an edit here too. They are
# imported when a config is checked, not when this module is: reading a stored config (`fedmpi report`,
# `fedmpi verify`) then needs no torch.
def _datasets():
    from fedmpi.data.sources import LOADERS

    return tuple(LOADERS)


def _check_plugin_name(c, key, name, builtin, group, what):
    """`name` must be a built-in (`builtin`), an installed entry point of `group` or a `package.module:attr`
    path; the plug-in itself is imported only when the data set or model is made (fedmpi.core.plugin_names)."""
    from fedmpi.core import plugin_names

    if name in builtin or plugin_names.known(name, group):
        return
    if isinstance(name, str) and ":" in name:
        c.require(False, key, name, f"not a valid plug-in name; write 'package.module:{what}' (an absolute "
                                    f"module path and a name in it), or one of {', '.join(builtin)}")
        return
    installed = tuple(plugin_names.installed(group))
    c.choice(key, name, builtin + installed + (f"'package.module:{what}'",))


def _check_mapping(c, key, value):
    """A free mapping (data.kwargs, model.kwargs): identifier keys, any YAML values."""
    c.require(isinstance(value, dict) and all(isinstance(k, str) and k.isidentifier() for k in value), key, value,
              "must be a mapping of keyword names (identifiers) to values")


def _schemes():
    from fedmpi.data.partition import SCHEMES

    return tuple(SCHEMES)


def _models():
    from fedmpi.core.model_shape import ZOO_MODELS

    return ZOO_MODELS


def _server_optimizers():
    from fedmpi.round.server_opt import OPTIMIZERS

    return tuple(OPTIMIZERS)


@dataclass(frozen=True)
class DataConfig:
    name: str = "synthetic"
    root: str | None = None          # folder with the dataset's official files
    download: bool = False              # let torchvision fetch where a network exists
    alpha: float = 1.0                  # SYNTHETIC(alpha, beta): spread of the client models
    beta: float = 1.0                   # SYNTHETIC(alpha, beta): spread of the client inputs
    iid: bool = False                   # SYNTHETIC's IID variant: one shared model and input law
    split: str = "balanced"             # EMNIST split
    classes: int | None = None       # keep only the first `classes` classes (FSL trains on 45 EMNIST classes)
    augment: bool = False               # CIFAR pad-crop-flip on tensors
    # A plug-in data set's own keyword arguments (`data.name: package.module:function`, fedmpi.data.plugins)
    kwargs: dict = field(default_factory=dict)
    # data.name: arrays on a Hugging Face folder: the columns {x: ..., y: ..., client: ...} (fedmpi.data.arrays)
    columns: dict = field(default_factory=dict)

    # Bounds beside the section's own checks (fedmpi.core.config_checks.Range): finite arithmetic, bounded memory.
    RANGES: ClassVar[dict] = {"alpha": factor(), "beta": factor(), "classes": count()}

    def __post_init__(self):
        c = _Checks("data")
        builtin = _datasets()
        _check_plugin_name(c, "name", self.name, builtin, "fedmpi.datasets", "function")
        _check_mapping(c, "kwargs", self.kwargs)
        c.require(not self.kwargs or self.name not in builtin, "kwargs", self.kwargs,
                  f"passes keyword arguments to a plug-in data set; data.name = {self.name!r} is built in and "
                  f"takes none: remove it")
        if isinstance(self.columns, dict):
            from fedmpi.data.arrays import check_columns

            c.errors.extend(check_columns(self.columns))
        else:
            c.require(False, "columns", self.columns, "must be a mapping {x: COLUMN, y: COLUMN, client: COLUMN}")
        c.require(self.alpha >= 0, "alpha", self.alpha, "must be >= 0")
        c.require(self.beta >= 0, "beta", self.beta, "must be >= 0")
        c.require(self.classes is None or self.classes >= 2, "classes", self.classes, "must be >= 2 or null")
        if not c.errors and self.name in builtin:
            from fedmpi.data.sources import USES

            refuse_unused(c, self, "name", USES, "data set")
        if not c.errors and self.name == "arrays" and self.root:
            refuse_unused(c, self, "root", ARRAY_ROOT_USES, "data.root", form=_array_root_kind(self.root))
        c.done()


# data.name: arrays reads its columns by name from a saved Hugging Face folder only; an .npz or HDF5 file has
# its arrays under fixed names (fedmpi.data.arrays).
ARRAY_ROOT_USES = {"an .npz or HDF5 file": (), "a Hugging Face folder": ("columns",)}


def _array_root_kind(root):
    from fedmpi.data.arrays import HDF5_SUFFIXES

    return "an .npz or HDF5 file" if root.endswith((".npz", *HDF5_SUFFIXES)) else "a Hugging Face folder"


@dataclass(frozen=True)
class PartitionConfig:
    clients: int = 30
    scheme: str = "dirichlet"
    beta: float = 0.5                   # dirichlet, quantity concentration
    labels_per_client: int = 2          # labels (#C=k)
    shards_per_client: int = 2          # shards
    classes_per_client: int = 2         # classes (FSL)
    samples_per_client: int | None = None  # classes (FSL); synthetic: fixed size instead of lognormal
    min_samples: int = 10               # dirichlet redraws until every client has this many
    # groups: [{clients: K, labels: [..]}, ...], client ids dealt in this order (SAFL's client groups);
    # kept as ((K, (label, ...)), ...)
    groups: tuple = ()
    # fraction of each client's samples held out as its own test split (fedmpi.data.local_test); 0 = none
    local_test: float = 0.0

    RANGES: ClassVar[dict] = {"clients": clients_range(), "beta": factor(low_open=True),
                              "samples_per_client": count(), "min_samples": count(0),
                              "labels_per_client": count(), "shards_per_client": count(),
                              "classes_per_client": count(), "local_test": Range(0, 1, high_open=True)}

    def __post_init__(self):
        c = _Checks("partition")
        c.choice("scheme", self.scheme, _schemes())
        c.require(self.clients >= 1, "clients", self.clients, "must be a positive integer")
        c.require(self.samples_per_client is None or self.samples_per_client >= 1, "samples_per_client",
                  self.samples_per_client, "must be a positive integer or null")
        c.require(self.min_samples >= 0, "min_samples", self.min_samples, "must be >= 0")
        groups = _label_groups(self.groups)
        c.require(groups is not None, "groups", self.groups,
                  "must be a list of {clients: K, labels: [label, ...]} (K >= 1, labels >= 0, at least one each)")
        if groups is not None:
            object.__setattr__(self, "groups", groups)
            total = sum(k for k, _ in groups)
            c.require(self.scheme != "groups" or (groups and total == self.clients), "groups", self.groups,
                      f"partition.scheme = 'groups' needs groups whose clients add up to partition.clients "
                      f"({self.clients}); they add up to {total}")
        if not c.errors:
            from fedmpi.data.partition import USES

            refuse_unused(c, self, "scheme", USES, "scheme")
        c.done()


def _label_groups(value):
    """`partition.groups` as ((clients, (label, ...)), ...), from mappings or [clients, labels] pairs (the form
    a stored config is read back in); None when malformed."""
    if not isinstance(value, (list, tuple)):
        return None
    groups = []
    for item in value:
        if isinstance(item, dict) and set(item) == {"clients", "labels"}:
            k, labels = item["clients"], item["labels"]
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            k, labels = item
        else:
            return None
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1 and isinstance(labels, (list, tuple))
                and labels and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in labels)):
            return None
        groups.append((k, tuple(sorted(set(labels)))))
    return tuple(groups)


# The server_data keys each scheme reads (fedmpi.data.server_set.draw_server_set); ServerDataConfig refuses a
# key only the other scheme reads, set to a value other than its default.
SERVER_SET_USES = {"iid": (), "classes": ("classes",), "dirichlet": ("beta",)}


@dataclass(frozen=True)
class ServerDataConfig:
    size: int = 0                       # 0 = the server holds no data
    scheme: Literal["iid", "classes", "dirichlet"] = "iid"
    classes: int = 10                   # classes scheme: how many classes the server's set covers
    beta: float = 0.5                   # dirichlet scheme
    source: Literal["overlap", "holdout"] = "overlap"
    # The set's size relative to the clients' data D, |G| = fraction * |D| (Zhao et al.'s beta), instead of
    # `size` (fedmpi.data.server_set.resolved_size).
    fraction: float | None = None
    # source holdout: training samples reserved from the clients' pool (Zhao et al.'s H); the set is drawn
    # from them, so the clients' data stays the same whatever the set's size. 0: only the set is removed.
    holdout: int = 0

    RANGES: ClassVar[dict] = {"fraction": factor(), "size": count(0, samples=True), "holdout": count(0, samples=True),
                              "classes": count(), "beta": factor(low_open=True)}

    def __post_init__(self):
        c = _Checks("server_data")
        c.require(self.size >= 0, "size", self.size, "must be >= 0")
        c.require(self.fraction is None or self.fraction >= 0, "fraction", self.fraction, "must be >= 0 or null")
        c.require(self.fraction is None or self.size == 0, "fraction", self.fraction,
                  f"set either server_data.size ({self.size}) or server_data.fraction, not both")
        c.require(self.holdout >= 0, "holdout", self.holdout, "must be >= 0")
        c.require(self.holdout == 0 or self.source == "holdout", "holdout", self.holdout,
                  f"reserves samples from the clients' pool: needs server_data.source = 'holdout' "
                  f"(is {self.source!r})")
        c.require(self.holdout == 0 or self.size <= self.holdout, "size", self.size,
                  f"must be <= server_data.holdout ({self.holdout}), the reserve the set is drawn from")
        if not c.errors:
            refuse_unused(c, self, "scheme", SERVER_SET_USES, "scheme")
        c.done()

    @property
    def wanted(self) -> bool:
        """Whether a non-empty server set is configured (by size or by fraction)."""
        return self.size > 0 or bool(self.fraction)


@dataclass(frozen=True)
class ModelConfig:
    name: str = "lr"
    hidden: int = 200                   # mlp width
    norm: Literal["batch", "group"] = "group"   # resnet18 normalisation
    projection: int | None = None    # simple_cnn projection head size (MOON)
    # fnmatch patterns over parameter/buffer names (named_parameters, named_buffers) whose entries each client
    # keeps for itself (personalized FL, fedmpi.core.personal); [] = everything is shared
    personal: tuple[str, ...] = ()
    mlp_norm: Literal["none", "batch"] = "none"   # mlp: BatchNorm1d after each hidden layer (FedBN on a small model)
    # A plug-in model's constructor arguments (`model.name: package.module:Class`, fedmpi.core.model_plugins)
    kwargs: dict = field(default_factory=dict)

    RANGES: ClassVar[dict] = {"hidden": count(), "projection": count()}     # 10^6 units: 10^12 weights beside

    def __post_init__(self):
        c = _Checks("model")
        c.require(all(isinstance(p, str) and p for p in self.personal), "personal", self.personal,
                  "must be a list of non-empty fnmatch patterns over the model's parameter names, e.g. ['3.*']")
        builtin = _models()
        _check_plugin_name(c, "name", self.name, builtin, "fedmpi.models", "Class")
        _check_mapping(c, "kwargs", self.kwargs)
        c.require(not self.kwargs or self.name not in builtin, "kwargs", self.kwargs,
                  f"passes constructor arguments to a plug-in model; model.name = {self.name!r} is built in "
                  f"and takes its own keys (hidden, norm, ...): remove it")
        c.require(self.hidden >= 1, "hidden", self.hidden, "must be a positive integer")
        c.require(self.projection is None or self.projection >= 1, "projection", self.projection,
                  "must be a positive integer or null")
        if not c.errors:
            refuse_unused(c, self, "name", MODEL_USES, "built-in model",
                          form="built-in" if self.name in builtin else "a plug-in")
        c.done()


# The model keys fedmpi's own builders read (fedmpi.core.models); a plug-in model (or torchvision:NAME) is
# built from model.kwargs alone (fedmpi.core.model_plugins), so these would change nothing for it.
MODEL_USES = {"built-in": ("hidden", "norm", "mlp_norm"), "a plug-in": ()}   # projection: models.py says whose


@dataclass(frozen=True)
class ClientConfig:
    lr: float = 0.05
    batch_size: int = 10
    epochs: int = 1                     # local epochs, used when `steps` is null
    steps: int | None = None         # local SGD steps; overrides epochs
    momentum: float = 0.0
    weight_decay: float = 0.0
    vectorize: Literal["auto", "on", "off"] = "auto"
    lr_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)   # eta_l per round
    compress: CompressConfig = field(default_factory=CompressConfig)  # upload compression (docs/how-to/deployment.md)
    # Drop each epoch's short last batch, as a DataLoader with drop_last=True (FedSkip's CIFAR loaders);
    # a client with fewer than batch_size samples keeps its one short batch (fedmpi.core.train.steps_per_epoch).
    drop_last: bool = False

    RANGES: ClassVar[dict] = {"lr": factor(low_open=True), "weight_decay": factor(), "epochs": count(),
                              "steps": count(), "batch_size": count(), "momentum": Range(0, 1, high_open=True)}

    def __post_init__(self):
        c = _Checks("client")
        c.require(self.lr > 0, "lr", self.lr, "must be > 0")
        c.require(self.batch_size >= 1, "batch_size", self.batch_size, "must be a positive integer")
        c.require(self.epochs >= 1, "epochs", self.epochs, "must be a positive integer")
        c.require(self.steps is None or self.steps >= 1, "steps", self.steps, "must be a positive integer or null")
        c.require(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
        c.require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        _check_min_lr(c, self.lr, self.lr_schedule)
        c.done()


def _check_min_lr(c, lr, schedule):
    """A cosine schedule decays from lr to min_lr; a min_lr above lr was silently clamped to lr."""
    c.require(schedule.name != "cosine" or schedule.min_lr <= lr, "lr_schedule.min_lr", schedule.min_lr,
              f"must be <= {c.section}.lr ({lr:g}): the cosine schedule decays from lr down to min_lr")


def _part(server, part):
    """The value of `part` of UNUSED_CHECKED ("betas[1]": the second beta) in a ServerConfig or a dict."""
    get = server.get if isinstance(server, dict) else lambda key: getattr(server, key)
    if part.startswith("betas["):
        return get("betas")[int(part[6])]
    return get(part)


@dataclass(frozen=True)
class ServerConfig:
    clients_per_round: int = 10
    lr: float = 1.0                     # eta_g; 1.0 with sgd = plain averaging
    optimizer: str = "sgd"              # how the aggregated update is applied (fedmpi.round.server_opt)
    momentum: float = 0.9               # avgm: beta
    betas: tuple[float, float] = (0.9, 0.99)   # adam, yogi, adagrad: (b1, b2)
    # adam, yogi, adagrad: adaptivity (Reddi et al.), in (0, 1e3]: the step is lr * m / (sqrt(v) + tau), so a
    # tau far above any sqrt(v) only scales the step down (Reddi et al. tune it in [1e-10, 1]).
    tau: float = 1e-3
    lr_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)   # eta_g per round
    # Rank 0 hosts clients too; null: when its node has a core the other ranks leave idle. Results do not
    # depend on it (a run-time key: not hashed, may change on --resume).
    trains_clients: bool | None = None
    deadline: float | None = None       # simulated seconds after which updates do not count (docs/how-to/deployment.md)
    over_select: float | None = None    # extra clients selected, keeping the first clients_per_round to arrive
    # fixed: exactly clients_per_round clients per round; poisson: each client joins independently with
    # rate clients_per_round / partition.clients (the sampling DP accounting assumes; docs/how-to/privacy.md)
    sampling: Literal["fixed", "poisson"] = "fixed"
    # How the round's updates are combined (fedmpi.robust, docs/how-to/robustness.md): mean is the weighted mean of the
    # plain reduction; the robust rules see every counted update through a chunked gather; `robust` their keys.
    aggregator: str = "mean"
    robust: RobustConfig = field(default_factory=RobustConfig)
    # none: the server sums the clients' float updates; secagg / secagg_plus: it sees only the modular sum of
    # masked integer uploads (the `secagg:` section, fedmpi.secagg; docs/how-to/secure-aggregation.md)
    secure_aggregation: Literal["none", "secagg", "secagg_plus"] = "none"
    # A client's weight in the average: samples, its sample count n_i (McMahan et al.); uniform, 1 for every
    # client (pfl-research's `weight_by_samples: false`). Privacy and secure aggregation weigh uniformly anyway.
    weighting: Literal["samples", "uniform"] = "samples"

    RANGES: ClassVar[dict] = {"lr": factor(low_open=True), "over_select": factor(),
                              "deadline": Range(0, 1e12, "simulated seconds: 30,000 years"),
                              "clients_per_round": clients_range(), "momentum": Range(0, 1, high_open=True),
                              "tau": Range(0, 1e3, "beyond, tau only scales the step down", low_open=True)}

    def __post_init__(self):
        c = _Checks("server")
        c.require(self.weighting in ("samples", "uniform"), "weighting", self.weighting,
                  "must be samples (by sample count) or uniform (every client 1)")
        c.require(not (self.weighting == "uniform" and self.aggregator != "mean"), "weighting", self.weighting,
                  f"uniform applies to the plain mean (server.aggregator: mean); {self.aggregator!r} weighs "
                  f"clients by its own rule")
        c.errors.extend(aggregator_problems(self.aggregator, self.robust, self.clients_per_round))
        c.require(self.secure_aggregation in ("none", "secagg", "secagg_plus"), "secure_aggregation",
                  self.secure_aggregation, "must be none, secagg or secagg_plus")
        c.require(self.clients_per_round >= 1, "clients_per_round", self.clients_per_round,
                  "must be a positive integer")
        c.require(self.lr > 0, "lr", self.lr, "must be > 0")
        _check_plugin_name(c, "optimizer", self.optimizer, _server_optimizers(), "fedmpi.server_optimizers", "Class")
        c.require(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
        c.require(all(0 <= b < 1 for b in self.betas), "betas", list(self.betas), "must be two numbers in [0, 1)")
        c.require(self.tau > 0, "tau", self.tau, "must be > 0")
        _check_min_lr(c, self.lr, self.lr_schedule)
        try:
            self.straggler_policy()
        except ConfigError as e:
            c.errors.extend(e.messages)
        if not c.errors:
            self._check_unused(c)
        c.done()

    def _check_unused(self, c, uses=None):
        """A momentum, beta or tau the optimizer does not read, set to a non-default value, is refused; `uses`:
        a plug-in's declaration, known once it is imported (fedmpi.round.server_opt.check_optimizer)."""
        from fedmpi.round.server_opt import OPTIMIZERS, UNUSED_CHECKED

        uses = getattr(OPTIMIZERS.get(self.optimizer), "uses", None) if uses is None else uses
        if uses is None:
            return
        for part in UNUSED_CHECKED:
            if part not in uses and _part(self, part) != _part(_SERVER_DEFAULTS, part):
                users = [name for name, cls in OPTIMIZERS.items() if part in (getattr(cls, "uses", None) or ())]
                key = part.split("[")[0]
                what = "" if key == part else f"its {'b1' if part.endswith('0]') else 'b2'} ({part}) "
                c.require(False, key, list(self.betas) if key == "betas" else getattr(self, key),
                          f"{what}is not used by server.optimizer {self.optimizer!r} (only by {', '.join(users)}); "
                          f"remove it or choose an optimizer that uses it")

    def straggler_policy(self) -> DeadlineConfig:
        """`deadline` and `over_select` as the deployment model's DeadlineConfig (checked there)."""
        return DeadlineConfig(self.deadline, self.over_select)


_SERVER_DEFAULTS = {f.name: f.default for f in fields(ServerConfig) if f.default is not MISSING}
