"""Experiment configuration: YAML into frozen dataclasses (docs/explanation/design.md, "The config").

The root (`Config`), loading a file with overrides, the config hash and the comparison of two configs live
here; the sections are in `fedmpi.config.sections`, `.training_sections` and `.run_sections` (and beside
their code for the deployment and privacy), typed building from mappings in `fedmpi.config.build`. Every
field has a type, a default and a docstring (docs/reference/config.md is generated from them); values are
type-checked when built and range-checked in each section's `__post_init__`. All problems of a config are
collected and reported together, one line each, naming the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import stat
import typing
from dataclasses import dataclass, field

import yaml

from fedmpi.attacks.keys import AttackConfig
from fedmpi.config import yamlio
from fedmpi.config.build import algorithm_keys
from fedmpi.config.build import build_section as _build
from fedmpi.config.run_sections import (  # noqa: F401 - the sections are part of fedmpi.config's interface
    MAX_THREADS,
    CheckpointConfig,
    EvalConfig,
    RuntimeConfig,
)
from fedmpi.config.sections import (  # noqa: F401 - the sections are part of fedmpi.config's interface
    DataConfig,
    ModelConfig,
    PartitionConfig,
    ServerDataConfig,
)
from fedmpi.config.training_sections import ClientConfig, ServerConfig
from fedmpi.core.config_checks import Checks as _Checks
from fedmpi.core.config_checks import count as _count
from fedmpi.core.config_checks import dotted as _dotted
from fedmpi.core.config_checks import show as _show
from fedmpi.core.errors import ConfigError
from fedmpi.core.input_files import read_input
from fedmpi.core.lora_keys import LoraConfig
from fedmpi.counterfactual.keys import CounterfactualConfig
from fedmpi.deploy.keys import ClientsConfig
from fedmpi.plans.keys import ParticipationConfig
from fedmpi.privacy.keys import PrivacyConfig
from fedmpi.secagg.keys import SecAggConfig
from fedmpi.unlearning.keys import UnlearningConfig
from fedmpi.uploads.keys import UploadsConfig

MAX_CONFIG_BYTES = 1 << 20      # a config file is a few kB


@dataclass(frozen=True)
class Config:
    """A whole experiment: the top-level keys and one section per component."""

    seed: int = 0
    """Seeds every random choice: the split, the model's initialisation, client selection, batches."""
    rounds: int = 100
    """Communication rounds."""
    out: str = "runs/quickstart"
    """The run's folder: run.h5 and ckpt/."""
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    server_data: ServerDataConfig = field(default_factory=ServerDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)            # adapters on model.name: causal_lm
    client: ClientConfig = field(default_factory=ClientConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    clients: ClientsConfig = field(default_factory=ClientsConfig)   # availability, dropout, speeds (deployment)
    algorithm: typing.Any = field(default_factory=lambda: algorithm_keys("fedavg")())
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)     # malicious clients (fedmpi.attacks)
    secagg: SecAggConfig = field(default_factory=SecAggConfig)     # secure aggregation (fedmpi.secagg)
    uploads: UploadsConfig = field(default_factory=UploadsConfig)   # plug-in upload stages (fedmpi.uploads)
    participation: ParticipationConfig = field(default_factory=ParticipationConfig)   # a plug-in provider
    counterfactual: CounterfactualConfig = field(default_factory=CounterfactualConfig)   # one declared change
    unlearning: UnlearningConfig = field(default_factory=UnlearningConfig)   # FedEraser's replay (fedmpi.unlearning)

    RANGES: typing.ClassVar[dict] = {"rounds": _count(0)}

    def __post_init__(self):
        c = _Checks("")
        # The seed is stored as a 64-bit integer in run.h5 and every checkpoint.
        c.require(0 <= self.seed < 2 ** 63, "seed", self.seed, "must be an integer in [0, 2^63)")
        c.require(self.rounds >= 0, "rounds", self.rounds, "must be >= 0")
        c.require(bool(self.out), "out", self.out, "must be a folder path")
        c.require(self.server.clients_per_round <= self.partition.clients, "server.clients_per_round",
                  self.server.clients_per_round,
                  f"must be <= partition.clients ({self.partition.clients})")
        c.require(self.model.name == "causal_lm" or self.lora == LoraConfig(), "lora", _lora_given(self.lora),
                  f"adapts a causal language model; model.name = {self.model.name!r} has no adapters: remove the "
                  f"lora section or set model.name: causal_lm")
        n = self.partition.clients
        for key in ("drop", "remove"):
            ids = getattr(self.counterfactual, key)
            c.require(all(i < n for i in ids), f"counterfactual.{key}", list(ids),
                      f"must be client ids below partition.clients ({n})")
        c.require(len(self.counterfactual.remove) < n, "counterfactual.remove", list(self.counterfactual.remove),
                  "removes every client; leave at least one")
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
        # runtime.wire_dtype changes the results (fedmpi.uploads.precision): hashed when not float32, so that
        # rounded runs group apart from the others and older runs keep their hash.
        if self.runtime.wire_dtype != "float32":
            d["runtime.wire_dtype"] = self.runtime.wire_dtype
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


# Keys that may differ between a checkpoint and a --resume (docs/explanation/design.md §1): whole sections, or dotted
# keys of run-time choices that do not change the results.
RUNTIME_KEYS = ("rounds", "checkpoint", "runtime", "out", "server.trains_clients", "counterfactual.of")

# Keys and sections added after runs were recorded. While they change nothing (at their default, or a
# section whose `inert` property says so, e.g. privacy with mechanism none) they are left out of
# Config.hash, so a run that does not use them keeps the hash it had before they existed: its checkpoints
# still resume and its reports still group with older runs. A new key whose default leaves the computation
# as it was belongs here; one that changes the computation by default does not.
HASH_OPTIONAL = ("server.optimizer", "server.momentum", "server.betas", "server.tau", "server.lr_schedule",
                 "client.lr_schedule", "eval.divergence", "eval.client_drift", "clients", "client.compress",
                 "server.deadline", "server.over_select", "server.sampling", "privacy", "attack",
                 "model.personal", "model.mlp_norm", "model.path", "model.arch", "lora", "partition.local_test",
                 "eval.local_every", "eval.local_clients",
                 "eval.finetune_steps",
                 "server.aggregator", "server.robust",
                 "server.secure_aggregation", "secagg", "data.kwargs", "data.columns", "model.kwargs",
                 "server.weighting", "uploads", "participation", "counterfactual", "unlearning")


def _lora_given(lora):
    """The keys of the `lora` section set to other than their defaults."""
    default = LoraConfig()
    return {f.name: getattr(lora, f.name) for f in dataclasses.fields(lora)
            if getattr(lora, f.name) != getattr(default, f.name)}


@functools.cache
def _defaults():
    return Config()


def _inert(cfg, dotted):
    value, default = cfg, _defaults()
    for part in dotted.split("."):
        value, default = getattr(value, part), getattr(default, part)
    return value == default or bool(getattr(value, "inert", False))


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
        data = read_input(path, name, at_most=MAX_CONFIG_BYTES + 1, error=ConfigError)
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
