"""The algorithms: the contract (`base`), the registry (`registry`) and fedmpi's own algorithms, which
register themselves on import. `algorithm.name` -> class through `registry.lookup`; the class is built from
its keys and an `AlgorithmContext` (`algorithm_context`, the one place that reads the config for it)."""

from fedmpi.algorithms.base import (
    REDUCE,
    Algorithm,
    AlgorithmContext,
    AlgorithmKeys,
    ClientRun,
    ClientTraining,
    PlanHistory,
    SetupContext,
    StandardDraws,
)
from fedmpi.algorithms.registry import lookup, register
from fedmpi.core.errors import ConfigError
from fedmpi.core.personal import ParameterSplit, personal_names, split_of
from fedmpi.core.schedules import LearningRate


def algorithm_context(cfg, dim, n_params, history=None, split=None, client_rate=None) -> AlgorithmContext:
    """The context an algorithm of this config is built with. `history` answers `selected(t)`: a run passes
    its participation provider's plans (a PlanHistory bound to `participation.plan`); without one (hook tests,
    `--dry-run`) it is the standard draw, which the default provider plans. `split`: the model's
    `personal_split` (None or empty: nothing personal). `client_rate`: the run's eta_l schedule
    (schedules.LearningRate), the one its clients train with; None builds it from `client` and `rounds`."""
    c = cfg.client
    client = ClientTraining(lr=c.lr, batch_size=c.batch_size, epochs=c.epochs, steps=c.steps, momentum=c.momentum,
                            drop_last=c.drop_last, lr_schedule=c.lr_schedule)
    if client_rate is None:
        client_rate = LearningRate.of(c, cfg.rounds)
    if history is None:
        history = StandardDraws(cfg.seed, cfg.partition.clients, cfg.server.clients_per_round)
    return AlgorithmContext(seed=cfg.seed, num_clients=cfg.partition.clients,
                            clients_per_round=cfg.server.clients_per_round, rounds=cfg.rounds, dim=dim,
                            n_params=n_params, history=history, client=client, client_rate=client_rate,
                            privacy_enabled=cfg.privacy.enabled, split=split if split else None)


def personal_split(cfg, model, algo_cls=None) -> ParameterSplit | None:
    """The flat model's personal entries as a ParameterSplit (None when nothing is personal): the entries
    `personal_entries` names (`model`: a FlatModel)."""
    names = personal_entries(cfg, model, algo_cls)
    return split_of(model.entries, model.dim, names) if names else None


def personal_entries(cfg, model, algo_cls=None) -> tuple:
    """The names of the model's personal entries: the union of `model.personal` and the algorithm class's
    `personal_patterns(keys, model)` (`model`: a FlatModel or its ModelShape). () when nothing is personal.
    ConfigError naming the key: a pattern that matches no parameter or buffer, patterns that leave nothing
    shared, an algorithm with its own split whose rule leaves nothing personal (`declares_personal_split`),
    personal entries under a protocol other than REDUCE (its uploads are not per-client vectors from the
    broadcast). Pure: fedmpi.run.resolve asks it of the model's shape."""
    algo_cls = lookup(cfg.algorithm.name) if algo_cls is None else algo_cls
    named = f"algorithm.name = {cfg.algorithm.name!r}"
    own = tuple(algo_cls.personal_patterns(cfg.algorithm, model))
    if declares_personal_split(algo_cls) and not personal_names(model.entries, model.dim, ((named, own),)):
        raise ConfigError(nothing_personal(cfg, algo_cls, named))
    names = personal_names(model.entries, model.dim, (("model.personal", tuple(cfg.model.personal)), (named, own)))
    if not any(numel for name, _, numel in model.entries if name in names):
        return ()       # only empty entries matched: nothing is personal
    if algo_cls.protocol != REDUCE:
        raise ConfigError(f"model.personal: personal parameters need an algorithm of the REDUCE family; {named} "
                          f"uploads by {algo_cls.protocol}; leave model.personal empty")
    return names


def declares_personal_split(algo_cls) -> bool:
    """Whether the class keeps entries personal by its own rule (`personal` or its own `personal_patterns`):
    FedPer, LG-FedAvg, FedRep, FedBN. `model.personal` beside another algorithm is not its split."""
    return bool(algo_cls.personal) or algo_cls.personal_patterns.__func__ is not Algorithm.personal_patterns.__func__


def nothing_personal(cfg, algo_cls, named) -> str:
    """The refusal of a split algorithm whose own rule keeps nothing personal on this model: its run would be
    FedAvg recorded under its name, so no limit of this kind is run, whatever spelling reached it
    (fedper `head: []`, lgfedavg `head: ["*"]`, fedbn on a model without normalization layers)."""
    head = getattr(cfg.algorithm, "head", None)
    key = f"algorithm.head = {list(head)}" if head is not None else named
    hint = getattr(algo_cls, "nothing_personal_hint", "") or "name at least one personal layer"
    return (f"{key}: {named} keeps nothing personal on this model (every parameter and buffer would be shared), "
            f"which is FedAvg under another name; {hint}, or use algorithm.name = 'fedavg'")


def prepare_model(cfg, module):
    """`module` as the configured algorithm wants it before it is flattened (its class's `prepare_model`, on
    the keys' form); returns it. An algorithm name that cannot be looked up leaves it as built: the resolve
    step refuses that name with every other problem of the config."""
    try:
        algo_cls = lookup(cfg.algorithm.name).form(cfg.algorithm)
    except ConfigError:
        return module
    algo_cls.prepare_model(cfg.algorithm, module)
    return module


def build_algorithm(cfg, dim, n_params, history=None, split=None) -> Algorithm:
    """The algorithm instance for `cfg.algorithm` (ConfigError for an unknown name)."""
    return lookup(cfg.algorithm.name).create(cfg.algorithm, algorithm_context(cfg, dim, n_params, history, split))


__all__ = ["Algorithm", "AlgorithmContext", "AlgorithmKeys", "ClientRun", "ClientTraining", "PlanHistory",
           "SetupContext", "StandardDraws", "algorithm_context", "build_algorithm", "declares_personal_split",
           "lookup", "personal_entries", "personal_split", "prepare_model", "register"]
