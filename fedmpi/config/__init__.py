"""Experiment configuration (DESIGN §2, contract): YAML into frozen dataclasses.

Every field has a type and a default; values are type-checked by `_coerce` and range-checked in each
section's `__post_init__`. All problems of a config are collected and reported together, one line each,
naming the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import math
import os
import re
import stat
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Literal

import yaml

from fedmpi.config import yamlio
from fedmpi.core.config_checks import Checks as _Checks
from fedmpi.core.config_checks import dotted as _dotted
from fedmpi.core.config_checks import show as _show
from fedmpi.core.errors import ConfigError
from fedmpi.core.schedules import ScheduleConfig
from fedmpi.deploy.keys import ClientsConfig, CompressConfig, DeadlineConfig
from fedmpi.mpi.runtime import parse_bytes
from fedmpi.privacy.keys import PrivacyConfig

# runtime.threads: torch threads per rank. A fixed bound (not this machine's cores) keeps a config valid or
# invalid alike on a login node and on the compute nodes; 4096 is above the hardware threads of any single
# node built so far, and torch.set_num_threads(100000) dies with MemoryError.
MAX_THREADS = 4096
MAX_CONFIG_BYTES = 1 << 20      # a config file is a few kB


# The names a section may take come from the registries that implement them, so that a new data source,
# partition scheme, model, algorithm or server optimizer is one registration, not an edit here too.
def _datasets():
    from fedmpi.data.sources import LOADERS

    return tuple(LOADERS)


def _schemes():
    from fedmpi.data.partition import SCHEMES

    return tuple(SCHEMES)


def _models():
    from fedmpi.core.models import BUILDERS

    return tuple(BUILDERS)


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

    def __post_init__(self):
        c = _Checks("data")
        c.choice("name", self.name, _datasets())
        c.require(self.alpha >= 0, "alpha", self.alpha, "must be >= 0")
        c.require(self.beta >= 0, "beta", self.beta, "must be >= 0")
        c.require(self.classes is None or self.classes >= 2, "classes", self.classes, "must be >= 2 or null")
        c.done()


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

    def __post_init__(self):
        c = _Checks("partition")
        c.choice("scheme", self.scheme, _schemes())
        c.require(self.clients >= 1, "clients", self.clients, "must be a positive integer")
        c.require(self.beta > 0, "beta", self.beta, "must be > 0")
        for key in ("labels_per_client", "shards_per_client", "classes_per_client"):
            c.require(getattr(self, key) >= 1, key, getattr(self, key), "must be a positive integer")
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

    def __post_init__(self):
        c = _Checks("server_data")
        c.require(self.size >= 0, "size", self.size, "must be >= 0")
        c.require(self.classes >= 1, "classes", self.classes, "must be a positive integer")
        c.require(self.beta > 0, "beta", self.beta, "must be > 0")
        c.require(self.fraction is None or self.fraction >= 0, "fraction", self.fraction, "must be >= 0 or null")
        c.require(self.fraction is None or self.size == 0, "fraction", self.fraction,
                  f"set either server_data.size ({self.size}) or server_data.fraction, not both")
        c.require(self.holdout >= 0, "holdout", self.holdout, "must be >= 0")
        c.require(self.holdout == 0 or self.source == "holdout", "holdout", self.holdout,
                  f"reserves samples from the clients' pool: needs server_data.source = 'holdout' "
                  f"(is {self.source!r})")
        c.require(self.holdout == 0 or self.size <= self.holdout, "size", self.size,
                  f"must be <= server_data.holdout ({self.holdout}), the reserve the set is drawn from")
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

    def __post_init__(self):
        c = _Checks("model")
        c.choice("name", self.name, _models())
        c.require(self.hidden >= 1, "hidden", self.hidden, "must be a positive integer")
        c.require(self.projection is None or self.projection >= 1, "projection", self.projection,
                  "must be a positive integer or null")
        c.done()


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
    compress: CompressConfig = field(default_factory=CompressConfig)     # upload compression (docs/deployment.md)
    # Drop each epoch's short last batch, as a DataLoader with drop_last=True (FedSkip's CIFAR loaders);
    # a client with fewer than batch_size samples keeps its one short batch (fedmpi.core.train.steps_per_epoch).
    drop_last: bool = False

    def __post_init__(self):
        c = _Checks("client")
        c.require(self.lr > 0, "lr", self.lr, "must be > 0")
        c.require(self.batch_size >= 1, "batch_size", self.batch_size, "must be a positive integer")
        c.require(self.epochs >= 1, "epochs", self.epochs, "must be a positive integer")
        c.require(self.steps is None or self.steps >= 1, "steps", self.steps, "must be a positive integer or null")
        c.require(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
        c.require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        c.done()


@dataclass(frozen=True)
class ServerConfig:
    clients_per_round: int = 10
    lr: float = 1.0                     # eta_g; 1.0 with sgd = plain averaging
    optimizer: str = "sgd"              # how the aggregated update is applied (fedmpi.round.server_opt)
    momentum: float = 0.9               # avgm: beta
    betas: tuple[float, float] = (0.9, 0.99)   # adam, yogi, adagrad: (b1, b2)
    tau: float = 1e-3                   # adam, yogi, adagrad: adaptivity (Reddi et al.)
    lr_schedule: ScheduleConfig = field(default_factory=ScheduleConfig)   # eta_g per round
    # Rank 0 hosts clients too; null: when its node has a core the other ranks leave idle. Results do not
    # depend on it (a run-time key: not hashed, may change on --resume).
    trains_clients: bool | None = None
    deadline: float | None = None       # simulated seconds after which updates do not count (docs/deployment.md)
    over_select: float | None = None    # extra clients selected, keeping the first clients_per_round to arrive
    # fixed: exactly clients_per_round clients per round; poisson: each client joins independently with
    # rate clients_per_round / partition.clients (the sampling DP accounting assumes; docs/privacy.md)
    sampling: Literal["fixed", "poisson"] = "fixed"

    def __post_init__(self):
        c = _Checks("server")
        c.require(self.clients_per_round >= 1, "clients_per_round", self.clients_per_round,
                  "must be a positive integer")
        c.require(self.lr > 0, "lr", self.lr, "must be > 0")
        c.choice("optimizer", self.optimizer, _server_optimizers())
        c.require(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")
        c.require(all(0 <= b < 1 for b in self.betas), "betas", list(self.betas), "must be two numbers in [0, 1)")
        c.require(self.tau > 0, "tau", self.tau, "must be > 0")
        try:
            self.straggler_policy()
        except ConfigError as e:
            c.errors.extend(e.messages)
        c.done()

    def straggler_policy(self) -> DeadlineConfig:
        """`deadline` and `over_select` as the deployment model's DeadlineConfig (checked there)."""
        return DeadlineConfig(self.deadline, self.over_select)


@dataclass(frozen=True)
class EvalConfig:
    every: int = 1
    # Test batches are the unit of evaluation shared among the ranks (batch b on rank b mod P): 100 gives a
    # 1,000-image test set ten units to spread, and stays large enough for the kernels to be efficient.
    batch_size: int = 100
    divergence: bool = False            # weight divergence from a centralized-SGD shadow (fedmpi.round.shadow)
    client_drift: bool = False          # per-client update norms and cosines with the aggregate (fedmpi.round.drift)

    def __post_init__(self):
        c = _Checks("eval")
        c.require(self.every >= 1, "every", self.every, "must be a positive integer")
        c.require(self.batch_size >= 1, "batch_size", self.batch_size, "must be a positive integer")
        c.done()


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10                     # rounds between checkpoints; 0 = only on a stop request
    keep: int = 2

    def __post_init__(self):
        c = _Checks("checkpoint")
        c.require(self.every >= 0, "every", self.every, "must be >= 0")
        c.require(self.keep >= 1, "keep", self.keep, "must be a positive integer")
        c.done()


@dataclass(frozen=True)
class RuntimeConfig:
    """How this job runs, not what it computes: may change on --resume."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = None       # torch threads per rank; null = node cores / ranks on the node
    progress: Literal["auto", "bar", "lines", "off"] = "auto"
    cuda_aware_mpi: bool = False
    on_nonfinite: Literal["stop", "continue"] = "stop"   # a NaN/inf loss or model: stop (status diverged) or go on
    shared_data: bool = True         # the ranks of a node share one read-only copy of the data set (MPI-3 window)
    # Per-client state (SCAFFOLD's c_i, compression residuals...) kept in host memory per rank, in bytes ("4GB",
    # "512MiB" or a number); beyond it, state spills to a file of the rank's in $TMPDIR. null: no limit.
    client_state_memory: str | int | None = None
    # GPU: deterministic kernels (torch.use_deterministic_algorithms, cuDNN, cuBLAS workspace) so that -n
    # invariance and resume hold on GPUs too; costs speed (docs/performance.md).
    deterministic: bool = False

    def __post_init__(self):
        c = _Checks("runtime")
        c.require(self.threads is None or 1 <= self.threads <= MAX_THREADS, "threads", self.threads,
                  f"must be a positive integer up to {MAX_THREADS}, or null")
        if self.client_state_memory is not None:
            try:
                parse_bytes(self.client_state_memory)
            except ValueError as e:
                c.require(False, "client_state_memory", self.client_state_memory, str(e))
        c.done()

    @property
    def client_state_bytes(self):
        """`client_state_memory` in bytes (None: no limit)."""
        return None if self.client_state_memory is None else parse_bytes(self.client_state_memory)


@dataclass(frozen=True)
class Config:
    seed: int = 0
    rounds: int = 100
    out: str = "runs/quickstart"
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    server_data: ServerDataConfig = field(default_factory=ServerDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    clients: ClientsConfig = field(default_factory=ClientsConfig)   # availability, dropout, speeds (deployment)
    algorithm: typing.Any = field(default_factory=lambda: _algorithm_keys("fedavg")())
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def __post_init__(self):
        c = _Checks("")
        c.require(self.seed >= 0, "seed", self.seed, "must be >= 0")
        c.require(self.rounds >= 0, "rounds", self.rounds, "must be >= 0")
        c.require(bool(self.out), "out", self.out, "must be a folder path")
        c.require(self.server.clients_per_round <= self.partition.clients, "server.clients_per_round",
                  self.server.clients_per_round,
                  f"must be <= partition.clients ({self.partition.clients})")
        c.done()

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_yaml(self):
        return yamlio.dump(self.to_dict())

    def hash(self, ignore=None):
        """Hash of everything that decides the computation; run-time keys excluded so resume may change them.
        Keys of HASH_OPTIONAL are left out while they change nothing (see there)."""
        ignore = RUNTIME_KEYS if ignore is None else ignore
        d = {k: v for k, v in self.to_dict().items() if k not in ignore}
        for key in ignore:
            section, _, name = key.partition(".")
            if name and isinstance(d.get(section), dict):
                d[section] = {k: v for k, v in d[section].items() if k != name}
        for dotted in HASH_OPTIONAL:
            if _inert(self, dotted):
                *parents, leaf = dotted.split(".")
                node = d
                for part in parents:
                    node = node[part]
                del node[leaf]
        return hashlib.sha256(yaml.safe_dump(d, sort_keys=True).encode()).hexdigest()[:16]


# Keys that may differ between a checkpoint and a --resume (DESIGN §1): whole sections, or dotted keys of
# run-time choices that do not change the results.
RUNTIME_KEYS = ("rounds", "checkpoint", "runtime", "out", "server.trains_clients")

# Keys and sections added after runs were recorded. While they change nothing (at their default, or a
# section whose `inert` property says so, e.g. privacy with mechanism none) they are left out of
# Config.hash, so a run that does not use them keeps the hash it had before they existed: its checkpoints
# still resume and its reports still group with older runs. A new key whose default leaves the computation
# as it was belongs here; one that changes the computation by default does not.
HASH_OPTIONAL = ("server.optimizer", "server.momentum", "server.betas", "server.tau", "server.lr_schedule",
                 "client.lr_schedule", "eval.divergence", "eval.client_drift", "clients", "client.compress",
                 "server.deadline", "server.over_select", "server.sampling", "privacy")


@functools.cache
def _defaults():
    return Config()


def _inert(cfg, dotted):
    value, default = cfg, _defaults()
    for part in dotted.split("."):
        value, default = getattr(value, part), getattr(default, part)
    return value == default or bool(getattr(value, "inert", False))


# --- building from mappings --------------------------------------------------------------------------

# `Optional[X]` and `X | None` (what annotations under `from __future__ import annotations` evaluate to).
_UNIONS = (typing.Union, types.UnionType)

def _type_name(tp):
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if origin in _UNIONS:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + " or null"
    if origin is tuple:
        return f"a list of {len(typing.get_args(tp))} values, each {_type_name(typing.get_args(tp)[0])}"
    names = {int: "an integer", float: "a number (not NaN or infinity)", bool: "true or false", str: "a string"}
    return names.get(tp, str(tp))


def _coerce(tp, value):
    """Returns (ok, value) for `value` read as type `tp`."""
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        if value is None:
            return True, None
        for inner in (a for a in typing.get_args(tp) if a is not type(None)):
            ok, coerced = _coerce(inner, value)
            if ok:
                return True, coerced
        return False, value
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            return False, value
        items = [_coerce(a, v) for a, v in zip(args, value)]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        # NaN and infinities are refused for every float key: a run with lr = inf only produces NaNs.
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False, value
        try:
            number = float(value)
        except OverflowError:       # an integer beyond float range
            return False, value
        return math.isfinite(number), number
    if tp is str:
        return isinstance(value, str), value
    return True, value


def _unknown(key, known):
    key = str(key)[:100]
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(sorted(known))}"
    return f"unknown key {_show(key)}{hint}"


def _build(cls, mapping, prefix, errors):
    """An instance of `cls` from `mapping`, or None where its own checks failed; problems go to `errors`.

    A section with any problem is replaced by its defaults for the checks across sections (so that
    `__post_init__` never sees None), and the cross-section problems that name such a section are
    dropped: they would be judged on defaults the user never wrote."""
    if not isinstance(mapping, dict):
        errors.append(f"{prefix or 'config'} = {_show(mapping)}: must be a mapping of keys")
        return cls()
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    kwargs, failed = {}, []
    for key, value in mapping.items():
        dotted = _dotted(prefix, key)
        if key not in known:
            errors.append(_unknown(dotted, known))
            continue
        tp = hints[key]
        if (key == "algorithm" and cls is Config) or dataclasses.is_dataclass(tp):
            algorithm = key == "algorithm" and cls is Config
            if not algorithm and isinstance(value, str) and "name" in {f.name for f in fields(tp)}:
                value = {"name": value}     # a bare name, e.g. client.lr_schedule: cosine
            before = len(errors)
            section = _build_algorithm(value, errors) if algorithm else _build(tp, value, dotted, errors)
            if section is None or len(errors) > before:
                failed.append(dotted)
                section = section if section is not None else tp()
            kwargs[key] = section
        else:
            ok, coerced = _coerce(tp, value)
            if ok:
                kwargs[key] = coerced
            else:
                errors.append(f"{dotted} = {_show(value)}: must be {_type_name(tp)}")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        errors.extend(_rooted(m, prefix) for m in e.messages if not any(_names_section(m, section)
                                                                        for section in failed))
        return None


def _names_section(message, section):
    """Whether `message` names a key of `section` (e.g. 'partition.clients' for 'partition')."""
    return re.search(rf"(?<![\w.]){re.escape(section)}\.", message) is not None


def _rooted(message, prefix):
    """A section reused at several places (ScheduleConfig) names its keys by its leaf name; root them."""
    leaf = prefix.rsplit(".", 1)[-1]
    if "." in prefix and message.startswith(leaf + ".") and not message.startswith(prefix + "."):
        return prefix + message[len(leaf):]
    return message


def _algorithm_keys(name):
    from fedmpi.algorithms.registry import lookup

    return lookup(name).Keys


def _build_algorithm(mapping, errors):
    if not isinstance(mapping, dict):
        mapping = {"name": mapping}
    mapping = {"name": "fedavg", **mapping}
    try:
        keys = _algorithm_keys(mapping["name"])
    except ConfigError as e:
        errors.extend(e.messages)
        return _algorithm_keys("fedavg")()
    return _build(keys, mapping, "algorithm", errors) or keys(name=mapping["name"])


def from_dict(mapping):
    errors = []
    cfg = _build(Config, mapping or {}, "", errors)
    if errors or cfg is None:
        raise ConfigError(list(dict.fromkeys(errors)))
    return cfg


def apply_overrides(mapping, overrides):
    """Applies `key=value` dotted overrides (values parsed as YAML) to a nested dict, returning a copy."""
    import copy

    out = copy.deepcopy(mapping or {})
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {_show(item)}: expected key=value, e.g. rounds=50 or algorithm.name=fsl")
        key, text = item.split("=", 1)
        value = yamlio.load(text, f"override {_show(key.strip())}") if text.strip() else None
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {} if node.get(part) is None or part != "algorithm" else {"name": node[part]}
            node = node[part]
        node[parts[-1]] = value
    return out


def load(path, overrides=()):
    """Reads a YAML config file, applies overrides and validates; raises ConfigError on any problem."""
    name = f"config file {_show(str(path), 300)}"
    mapping = yamlio.load(_read_text(path, name), name) or {}
    if not isinstance(mapping, dict):
        raise ConfigError(f"{name}: top level must be a mapping of keys")
    return from_dict(apply_overrides(mapping, overrides))


def _read_text(path, name):
    """The UTF-8 text of a config file; ConfigError for a folder, an unreadable, binary or huge file."""
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise ConfigError(f"{name} is a folder; give the path of a YAML file, e.g. jobs/configs/quickstart.yaml")
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{name} not found") from None
    except OSError as e:
        raise ConfigError(f"{name} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name} is larger than {MAX_CONFIG_BYTES >> 20} MiB; a config is a few kB of YAML")
    if b"\0" in data:
        raise ConfigError(f"{name} is a binary file, not YAML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name} is not UTF-8 text (invalid byte at offset {e.start})") from None


def from_yaml(text, source="stored config"):
    return from_dict(yamlio.load(text, source))


def differing_keys(a: Config, b: Config, ignore=RUNTIME_KEYS):
    """Dotted keys whose values differ between two configs, run-time keys excluded."""

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, _dotted(prefix, k))
            else:
                yield _dotted(prefix, k), v

    fa, fb = dict(flat(a.to_dict())), dict(flat(b.to_dict()))
    keys = sorted(set(fa) | set(fb))
    return [k for k in keys if k.split(".")[0] not in ignore and k not in ignore and fa.get(k) != fb.get(k)]
