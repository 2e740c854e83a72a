"""The sweep spec, a YAML file read as strictly as a run config, and its expansion into experiments.

    base: ../configs/quickstart.yaml      # the config every experiment starts from (relative to this file)
    out: runs/sweep-beta                  # the sweep's folder (relative to the working folder, as a config's out)
    overrides: {rounds: 50}               # dotted config keys for every experiment
    grid:                                 # cartesian product: one experiment per combination
      partition.beta: [0.1, 0.5]
      algorithm.name: [fedavg, fedprox]
    sets:                                 # explicit override sets: one more factor of the product
      - {name: fsl, algorithm.name: fsl, algorithm.gamma: 1.0}
      - {config: ../configs/other.yaml}   # a set may start from another config file
    # or several lists of sets, each one more factor:  sets: {split: [{...}, ...], method: [{...}, ...]}
    seeds: [0, 1, 2]                      # one experiment per seed (default: the config's own seed)
    ranks: 2                              # ranks per experiment, or {clients_per_rank: 5, max: 4}
    fork_from: runs/original@20           # optional: every experiment forks from this checkpoint (`--fork-from`)

Keys of `overrides`, `grid` and `sets` are dotted config keys, as in `fedmpi run` overrides (a mapping value
replaces that whole mapping); `seed` and `out` are the sweep's (`seeds`, `out`). Experiments are the product
sets x grid x seeds (each list of sets a factor, in order), the first set and the first grid key varying
slowest, seeds fastest; each is named after what it changes (`fsl_partition.beta-0.1_seed-2`: a set by its
`name`, else by its config file or its keys) and runs in OUT/NAME. Every problem of a spec is reported
at once, one line each naming the key (exit 2), before anything starts (docs/how-to/sweeps.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import ClassVar

import yaml

from fedmpi.config import yamlio
from fedmpi.config.build import bad_character, build_section
from fedmpi.core.config_checks import Checks, Range
from fedmpi.core.config_checks import show as _show
from fedmpi.core.errors import ConfigError
from fedmpi.io.fork import SPEC as FORK_SPEC

MAX_SPEC_BYTES = 1 << 20
MAX_EXPERIMENTS = 100_000      # a grid beyond this is a typo (a product of long lists), not a study
MAX_RANKS = 10 ** 6            # ranks of one experiment: beyond any machine's MPI launch
MAX_SEED = 2 ** 63             # seeds are stored as 64-bit integers (as a config's seed)
SEEDS_RULE = "must be a non-empty list of distinct integers in [0, 2^63), or null"
RANKS_RULE = f"must be an integer in [1, {MAX_RANKS:g}], or {{clients_per_rank: N, max: M}}"
SET_FIELDS = ("name", "config")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


@dataclass(frozen=True)
class RanksRule:
    """Ranks from an experiment's size: 1 (the server) + ceil(server.clients_per_round / clients_per_rank),
    at most `max` (null: at most what the launch has)."""

    clients_per_rank: int = 1
    max: int | None = None

    # Checked when the spec is built, as a config section's ranges (fedmpi.core.config_checks.Range).
    RANGES: ClassVar[dict] = {"clients_per_rank": Range(1, MAX_RANKS),
                              "max": Range(1, MAX_RANKS)}

    def of(self, clients_per_round):
        k = 1 + math.ceil(clients_per_round / self.clients_per_rank)
        return k if self.max is None else min(k, self.max)


@dataclass(frozen=True)
class SpecFile:
    """The spec's keys as written (typed by fedmpi.config.build, as a config section)."""

    out: str = ""
    base: str | None = None
    overrides: dict = field(default_factory=dict)
    grid: dict = field(default_factory=dict)
    sets: tuple | dict = ()
    seeds: tuple[int, ...] | None = None
    ranks: int | dict = 1
    fork_from: str | None = None


def _integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _out_of_range(mapping, errors):
    """Seeds and ranks that are integers beyond their range, each told its range (not "must be an integer",
    which the type check would say of an integer beyond 64 bits); such a key is taken out of `mapping`, so
    that nothing else is said of it."""
    seeds = mapping.get("seeds")
    if isinstance(seeds, list) and seeds and all(map(_integer, seeds)) \
            and not all(0 <= s < MAX_SEED for s in seeds):
        errors.append(f"seeds = {_show(seeds)}: {SEEDS_RULE}")
        del mapping["seeds"]
    ranks = mapping.get("ranks")
    if _integer(ranks) and not 1 <= ranks <= MAX_RANKS:
        errors.append(f"ranks = {_show(ranks)}: {RANKS_RULE}")
        del mapping["ranks"]
    if isinstance(ranks, dict):
        for key, rng in RanksRule.RANGES.items():
            if _integer(ranks.get(key)) and not rng.holds(ranks[key]):
                errors.append(f"ranks.{key} = {_show(ranks[key])}: {rng.describe(True, ranks[key])}")
                mapping["ranks"] = ranks = {**ranks, key: int(rng.low)}     # the others still judged


def _check_written(written, mapping, errors):
    """What the types alone do not say (a key with a type error was left at its default, and is not judged:
    its one line already names it)."""
    c = Checks("")
    if "out" not in mapping:
        errors.append("out: missing; give the sweep's folder, e.g. out: runs/my-sweep")
    elif written.out == mapping["out"]:         # else its type check named it
        c.require(bool(written.out.strip()), "out", written.out, "must be the sweep's folder, e.g. out: runs/my-sweep")
    seeds = written.seeds
    c.require(seeds is None or (len(seeds) > 0 and all(0 <= s < MAX_SEED for s in seeds)
                                and len(set(seeds)) == len(seeds)), "seeds", seeds, SEEDS_RULE)
    c.require(not isinstance(written.ranks, int) or 1 <= written.ranks <= MAX_RANKS, "ranks", written.ranks,
              RANKS_RULE)
    fork_from = written.fork_from
    c.require(fork_from is None or bool(FORK_SPEC.match(str(fork_from))), "fork_from", fork_from,
              "must be OLD_OUT@ROUND, e.g. runs/original@20 (as fedmpi run --fork-from)")
    for key in ("grid", "sets"):
        c.require(key not in mapping or not isinstance(mapping[key], (list, dict)) or len(mapping[key]) > 0, key,
                  mapping.get(key), "is empty; give at least one entry, or leave the key out")
    errors.extend(c.errors)


@dataclass(frozen=True)
class Spec:
    path: str
    out: str
    ranks: object               # int, or a RanksRule
    experiments: tuple          # Experiment, in the spec's order
    fork_from: str | None = None    # OLD_OUT@ROUND every experiment starts from (fedmpi.io.fork), or None


@dataclass(frozen=True)
class Experiment:
    index: int
    name: str
    config: str                 # the config file it starts from
    overrides: dict             # dotted key -> value, in the order applied (the sweep's seed and out last)
    labels: dict = field(default_factory=dict)   # {axis: the name of its set}: `sets.AXIS` (a plain list: `sets`)

    def out(self, sweep_out):
        return os.path.join(sweep_out, self.name)

    def run_attrs(self):
        """What its run.h5 records of the sweep: `sweep_sets`, the names of its sets as JSON ({axis: name};
        fedmpi.analysis.runs makes them the columns `set` and `set.AXIS`)."""
        return {"sweep_sets": json.dumps(self.labels)} if self.labels else {}


def load(path) -> Spec:
    """The Spec of the YAML file `path`; ConfigError listing every problem (each line names the key)."""
    where = f"sweep spec {_show(str(path), 300)}"
    mapping = yamlio.load(_read(path, where), where)
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: top level must be a mapping of keys (base, out, grid, sets, seeds, ranks, "
                          f"overrides)")
    errors = []
    mapping = dict(mapping)
    _out_of_range(mapping, errors)
    written = build_section(SpecFile, mapping, "", errors)
    folder = os.path.dirname(os.path.abspath(path))
    _check_written(written, mapping, errors)
    overrides = _overrides(written.overrides, "overrides", errors)
    grid = _grid(written.grid, errors)
    axes = ([_sets(items, _axis(axis, errors), folder, errors) for axis, items in written.sets.items()]
            if isinstance(written.sets, dict) else [_sets(written.sets, "sets", folder, errors)] if written.sets
            else [])
    ranks = _ranks(written.ranks, errors)
    with_config = [sets for sets in axes if any(s["config"] for s in sets)]
    if len(with_config) > 1:
        errors.append("sets: `config` is given in two lists of sets; give it in one")
    if mapping.get("base") is None and (not with_config or not all(s["config"] for s in with_config[0])):
        errors.append("base: missing; give the config every experiment starts from (or a `config` in every set "
                      "of one list)")
    _overlaps(overrides, grid, axes, errors)
    if errors:
        raise ConfigError([f"{where}: {e}" for e in dict.fromkeys(errors)])
    # Counted from the lists' lengths before anything is expanded: a product of long lists (10^8 experiments)
    # would otherwise be built in full, gigabytes, before its size was judged.
    count = math.prod(len(sets) for sets in axes) * math.prod(len(values) for values in grid.values()) \
        * (len(written.seeds) if written.seeds is not None else 1)
    if count > MAX_EXPERIMENTS:
        raise ConfigError(f"{where}: grid x sets x seeds gives {count} experiments; at most {MAX_EXPERIMENTS}")
    base = None if written.base is None else os.path.join(folder, written.base)
    experiments = expand(base, overrides, grid, axes, written.seeds)
    names = {}
    for e in experiments:
        names.setdefault(e.name, []).append(e)
    twins = [n for n, es in names.items() if len(es) > 1]
    if twins:
        raise ConfigError(f"{where}: experiments share the folder name {_show(twins[0])}; give the sets "
                          f"distinct `name`s")
    if "index.csv" in names:
        raise ConfigError(f"{where}: an experiment's folder would be named 'index.csv', the sweep's index; give "
                          f"its set another `name`")
    return Spec(str(path), written.out, ranks, tuple(experiments), written.fork_from)


def _read(path, where):
    try:
        from fedmpi.core.input_files import read_input  # a regular file only, read up to its size

        data = read_input(path, where, at_most=MAX_SPEC_BYTES + 1, error=ConfigError)
    except IsADirectoryError:
        raise ConfigError(f"{where} is a folder; give the path of a YAML file") from None
    except FileNotFoundError:
        raise ConfigError(f"{where} not found") from None
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_SPEC_BYTES or b"\0" in data:
        raise ConfigError(f"{where} is not a YAML text of at most {MAX_SPEC_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text (invalid byte at offset {e.start})") from None


def _overrides(mapping, where, errors):
    """{dotted key: value} of one override mapping; `seed` and `out` are refused (the sweep sets them)."""
    out = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key.strip():
            errors.append(f"{where}: key {_show(key)} must be a dotted config key such as client.lr")
        elif key == "seed":
            errors.append(f"{where}.seed: set by the sweep; list the seeds under `seeds`")
        elif key == "out":
            errors.append(f"{where}.out: set by the sweep; each experiment runs in OUT/NAME (OUT: the spec's out)")
        else:
            out[key] = value
    return out


def _grid(mapping, errors):
    grid = {}
    for key, values in _overrides(mapping, "grid", errors).items():
        if not isinstance(values, (list, tuple)) or not values:
            errors.append(f"grid.{key} = {_show(values)}: must be a non-empty list of values")
        else:
            grid[key] = list(values)
    return grid


def _sets(items, axis, folder, errors):
    """One list of override sets (`axis`: where it is in the spec, for the messages)."""
    if not isinstance(items, (list, tuple)) or not items:
        errors.append(f"{axis} = {_show(items)}: must be a non-empty list of override sets")
        return []
    sets = []
    for i, item in enumerate(items):
        where = f"{axis}[{i}]"
        if not isinstance(item, dict):
            errors.append(f"{where} = {_show(item)}: must be a mapping of dotted config keys (and optionally "
                          f"name, config)")
            continue
        name, config = item.get("name"), item.get("config")
        for key, value in (("name", name), ("config", config)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                errors.append(f"{where}.{key} = {_show(value)}: must be a non-empty string")
            elif isinstance(value, str) and bad_character(value) is not None:
                errors.append(f"{where}.{key} = {_show(value)}: must not hold control characters (U+"
                              f"{ord(bad_character(value)[1]):04X} at {bad_character(value)[0]})")
            elif key == "name" and isinstance(value, str) and not _safe(value):
                errors.append(f"{where}.name = {_show(value)}: gives no folder name; use letters, digits or "
                              f"'._=+-'")
        values = _overrides({k: v for k, v in item.items() if k not in SET_FIELDS}, where, errors)
        if not values and config is None:
            errors.append(f"{where}: changes nothing; give dotted config keys or a `config`")
        sets.append({"name": name, "config": None if config is None else os.path.join(folder, str(config)),
                     "values": values, "axis": axis.removeprefix("sets.")})
    return sets


def _axis(name, errors):
    """`sets.NAME` of a named list of sets; its name labels the index's column, so it is held as a set's name."""
    if not isinstance(name, str) or not name.strip() or bad_character(name) is not None:
        errors.append(f"sets: list name {_show(name)} must be a non-empty string without control characters")
    return f"sets.{name}"


def _ranks(value, errors):
    if isinstance(value, int):
        return value
    if "clients_per_rank" not in value:
        errors.append("ranks.clients_per_rank: missing; ranks is an integer or {clients_per_rank: N, max: M}")
        value = {**value, "clients_per_rank": 1}      # the other keys are still judged
    return build_section(RanksRule, value, "ranks", errors)


def _overlaps(overrides, grid, axes, errors):
    """A key given twice would be decided by the order of application, which nobody reads: refused (a set
    may change a key of `overrides`: that is what a set is for)."""
    for key in grid:
        if key in overrides:
            errors.append(f"grid.{key}: also in overrides; give each key in one place")
    seen = {}
    for a, sets in enumerate(axes):
        keys = {key for s in sets for key in s["values"]}
        for key in sorted(keys):
            if key in grid:
                errors.append(f"sets: {key} is also a grid key; give each key in one place")
            elif seen.get(key, a) != a:
                errors.append(f"sets: {key} is set by two lists of sets; give each key in one list")
            seen.setdefault(key, a)


def expand(base, overrides, grid, axes, seeds):
    """[Experiment] of the product sets x grid x seeds (see the module docstring)."""
    keys = list(grid)
    points = list(itertools.product(*(grid[k] for k in keys))) if keys else [()]
    out = []
    for chosen in itertools.product(*axes):
        config = next((s["config"] for s in chosen if s["config"]), base)
        from_sets = {k: v for s in chosen for k, v in s["values"].items()}
        for point in points:
            for seed in (seeds if seeds is not None else [None]):
                values = {**overrides, **from_sets, **dict(zip(keys, point))}
                parts = [_set_label(s) for s in chosen]
                parts += [f"{k}-{_label(v)}" for k, v in zip(keys, point)]
                if seed is not None:
                    parts.append(f"seed-{seed}")
                    values["seed"] = seed
                name = _safe("_".join(p for p in parts if p)) or "run"
                labels = {s["axis"]: _set_label(s) for s in chosen}
                out.append(Experiment(len(out), name, config, values, labels))
    return out


def _set_label(s):
    if s["name"]:
        return s["name"]
    if s["config"] and not s["values"]:
        return os.path.splitext(os.path.basename(s["config"]))[0]
    return "_".join(f"{k}-{_label(v)}" for k, v in s["values"].items())


def _label(value):
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("...").strip()


def _safe(text):
    return _UNSAFE.sub("_", text).strip("._")[:200]


def with_out(experiment, sweep_out):
    """The experiment's overrides with its `out` (OUT/NAME)."""
    return dataclasses.replace(experiment, overrides={**experiment.overrides, "out": experiment.out(sweep_out)})
