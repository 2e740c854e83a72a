"""The config's sections as frozen dataclasses, one per top-level key (data, partition, server_data, model;
client and server are in fedmpi.config.training_sections, eval, checkpoint and runtime in
fedmpi.config.run_sections, the deployment's, privacy's, lora's,
attack's and secure aggregation's beside their code in fedmpi.deploy.keys, fedmpi.privacy.keys,
fedmpi.core.lora_keys, fedmpi.attacks.keys and fedmpi.secagg.keys). Every field has a type and a default;
each section range-checks its own values in `__post_init__`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from fedmpi.core.config_checks import Checks as _Checks
from fedmpi.core.config_checks import Range, clients_range, count, factor, refuse_unused


# The names a section may take come from the registries that implement them, so that a new data source,
# partition scheme, model, algorithm or server optimizer (fedmpi.config.training_sections) is one
# registration, not an edit here too. They are imported when a config is checked, not when this module is:
# reading a stored config (`fedmpi report`, `fedmpi verify`) then needs no torch.
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


@dataclass(frozen=True)
class DataConfig:
    """The data set (`data:`): which one, where its files are, and the options of the built-in ones."""

    name: str = "synthetic"
    """The data set: a built-in one (synthetic, mnist5k, mnist, fashion_mnist, emnist, cifar10, cifar100, femnist,
    shakespeare, arrays), an installed entry point of `fedmpi.datasets`, or `package.module:function`."""
    root: str | None = None
    """Folder with the data set's official files (arrays: an .npz or HDF5 file, or a saved Hugging Face folder)."""
    download: bool = False
    """Let torchvision fetch the files where a network exists."""
    alpha: float = 1.0
    """SYNTHETIC(alpha, beta) of FedProx: the spread of the client models."""
    beta: float = 1.0
    """SYNTHETIC(alpha, beta) of FedProx: the spread of the client inputs."""
    iid: bool = False
    """SYNTHETIC's IID variant: one shared model and input law."""
    split: str = "balanced"
    """The EMNIST split."""
    classes: int | None = None
    """Keep only the first `classes` classes (FSL trains on 45 EMNIST classes); null: all."""
    augment: bool = False
    """CIFAR's pad-crop-flip augmentation, on tensors."""
    kwargs: dict = field(default_factory=dict)
    """A plug-in data set's own keyword arguments (`data.name: package.module:function`, fedmpi.data.plugins)."""
    columns: dict = field(default_factory=dict)
    """data.name: arrays on a Hugging Face folder: the columns {x: ..., y: ..., client: ...} (fedmpi.data.arrays)."""

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
    """How the training set is split among the clients (`partition:`)."""

    clients: int = 30
    """The number of clients N."""
    scheme: str = "dirichlet"
    """iid, dirichlet, labels (#C=k), shards, classes (FSL), quantity, natural (a LEAF source's own users) or
    groups (fixed label sets per client group, `groups`)."""
    beta: float = 0.5
    """dirichlet, quantity: the concentration (smaller = more skewed)."""
    labels_per_client: int = 2
    """labels: the labels each client holds (#C=k)."""
    shards_per_client: int = 2
    """shards: the shards of sorted samples each client holds."""
    classes_per_client: int = 2
    """classes (FSL): the classes each client holds."""
    samples_per_client: int | None = None
    """classes (FSL): each client's sample count; synthetic: a fixed size instead of a lognormal one."""
    min_samples: int = 10
    """dirichlet, quantity: the draw is repeated until every client has this many samples."""
    groups: tuple = ()
    """groups: [{clients: K, labels: [...]}, ...], client ids dealt in this order (SAFL's client groups); kept
    as ((K, (label, ...)), ...)."""
    local_test: float = 0.0
    """Fraction of each client's samples held out as its own test split (stratified by label, seeded per
    client; fedmpi.data.local_test); 0 = none."""

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
    """The server's own data set (`server_data:`): FSL's D0, data sharing's G, SAFL's probe set."""

    size: int = 0
    """Samples in the server's set; 0 = the server holds no data."""
    scheme: Literal["iid", "classes", "dirichlet"] = "iid"
    """How the set is drawn from the training set: iid, a few classes (`classes`), or Dirichlet (`beta`)."""
    classes: int = 10
    """classes scheme: how many classes the server's set covers."""
    beta: float = 0.5
    """dirichlet scheme: the concentration over the labels."""
    source: Literal["overlap", "holdout"] = "overlap"
    """overlap: the set is drawn from the training set the clients share too; holdout: it is removed from the
    clients' pool."""
    fraction: float | None = None
    """The set's size relative to the clients' data D, |G| = fraction * |D| (Zhao et al.'s beta), instead of
    `size` (fedmpi.data.server_set.resolved_size)."""
    holdout: int = 0
    """source holdout: training samples reserved from the clients' pool (Zhao et al.'s H); the set is drawn
    from them, so the clients' data stays the same whatever the set's size. 0: only the set is removed."""

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
    """The model (`model:`): one of fedmpi's zoo, or a plug-in built from `kwargs`."""

    name: str = "lr"
    """lr, mlp, cnn_mnist, cnn2, simple_cnn, pfl_cnn, lstm, resnet18, causal_lm (a Hugging Face causal language
    model, with LoRA adapters from the `lora` section); or an installed entry point of `fedmpi.models`,
    `torchvision:NAME`, or `package.module:Class` (built with `kwargs`)."""
    hidden: int = 200
    """mlp: the width of each hidden layer."""
    norm: Literal["batch", "group"] = "group"
    """resnet18: its normalisation layers."""
    projection: int | None = None
    """simple_cnn, resnet18: the size of MOON's projection head; null: none."""
    personal: tuple[str, ...] = ()
    """fnmatch patterns over parameter/buffer names (named_parameters, named_buffers) whose entries each client
    keeps for itself (personalized FL, fedmpi.core.personal); [] = everything is shared."""
    mlp_norm: Literal["none", "batch"] = "none"
    """mlp: batch, a BatchNorm1d after each hidden layer (FedBN on a small model)."""
    kwargs: dict = field(default_factory=dict)
    """A plug-in model's constructor arguments (`model.name: package.module:Class`, fedmpi.core.model_plugins)."""
    path: str | None = None
    """causal_lm: a local Hugging Face model folder (config.json and weights), loaded with `from_pretrained(path,
    local_files_only=True)` in float32; its vocab_size must equal the data set's class count. null: built
    from `arch`."""
    arch: dict = field(default_factory=dict)
    """causal_lm without a path: transformers config keys of a freshly initialised model, e.g. {model_type:
    gpt2, n_layer: 2, n_embd: 32, n_head: 2} (model_type defaults to gpt2; vocab_size is the data set's class
    count)."""

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
        _check_mapping(c, "arch", self.arch)
        c.require(self.path is None or (isinstance(self.path, str) and self.path), "path", self.path,
                  "must be a local Hugging Face model folder or null")
        c.require(not (self.path and self.arch), "arch", self.arch,
                  f"builds a fresh model, but model.path = {self.path!r} loads one: set one of them")
        if not c.errors:
            form = self.name if self.name in MODEL_USES else "built-in" if self.name in builtin else "a plug-in"
            refuse_unused(c, self, "name", MODEL_USES, "built-in model", form=form)
        c.done()


# The model keys fedmpi's own builders read (fedmpi.core.models); a plug-in model (or torchvision:NAME) is
# built from model.kwargs alone (fedmpi.core.model_plugins), so these would change nothing for it; a causal
# language model reads its folder or its transformers config (fedmpi.core.causal_lm).
MODEL_USES = {"built-in": ("hidden", "norm", "mlp_norm"), "causal_lm": ("path", "arch"),
              "a plug-in": ()}   # projection: models.py says whose
