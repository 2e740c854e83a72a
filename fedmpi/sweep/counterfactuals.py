"""`fedmpi counterfactual ORIGINAL --out DIR (--drop-each | --drop IDS | --subsets all|FILE) [--from-round R]`:
the counterfactuals of a run, packed into one launch as a sweep (docs/how-to/counterfactuals.md).

The original's own config (the `config` attribute of its run.h5) is the sweep's base, written to DIR/original.yaml;
each counterfactual is one set of the sweep spec DIR/counterfactuals.yaml (`counterfactual.drop`, or `.remove`
with --remove, and `counterfactual.of`, the original's folder), so `fedmpi sweep` runs them, one launch for all,
in groups of ranks, continued from their checkpoints when the launch is started again, indexed in DIR/index.csv.
With --from-round R > 0 every counterfactual forks from the original's checkpoint after round R (the spec's
`fork_from`): rounds 0..R-1 are not recomputed, and are the original's bit for bit.

  --drop-each        one run per client, without it: leave-one-out (`--clients` narrows the list)
  --drop 3,5         one run without clients 3 and 5
  --subsets all      one run per proper subset S of the clients, keeping S (exact Shapley by enumeration; at
                     most 2^12 runs); a FILE instead lists one subset per line (client ids separated by commas or
                     spaces; an empty line is the empty set), e.g. the subsets a Monte Carlo estimate asks for
Every rank writes the same two files (each atomically) and then runs the sweep, as `fedmpi sweep` does. The
counterfactuals record no updates (`checkpoint.updates`) unless --record-updates asks.
"""

from __future__ import annotations

import itertools
import os

from fedmpi.config import yamlio
from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.input_files import check_input

MAX_ENUMERATED = 12     # --subsets all: 2^12 - 1 runs is already a long study


def read_original(original) -> dict:
    """The original run's stored config (parsed YAML, nothing imported; read as `fedmpi report` reads a run, also
    while it is still running); InputError naming what is missing."""
    from fedmpi.analysis.report import one_line, read_run

    path = os.path.join(original, "run.h5")
    if not os.path.isfile(path):
        raise InputError(f"counterfactual: {show(original)} holds no run.h5; give the original run's folder")
    check_input(path, f"counterfactual: {path}")
    try:
        cfg = read_run(path).config
    except (OSError, KeyError, ValueError, RuntimeError) as e:     # MalformedRun is a ValueError
        raise InputError(f"counterfactual: {path} cannot be read as a run file ({one_line(e)})") from None
    if not cfg:
        raise InputError(f"counterfactual: {path} records no config; is it a fedmpi run file?")
    return cfg


def parse_ids(text, where) -> list:
    """Client ids from '3,5' or '3 5'; ConfigError naming `where`."""
    parts = [p for p in text.replace(",", " ").split()]
    if not all(p.isdigit() for p in parts):
        raise ConfigError(f"{where} = {show(text)}: expected client ids (non-negative integers), e.g. 3,5")
    return sorted({int(p) for p in parts})


def _subsets(spec, clients) -> list:
    """The kept subsets --subsets asks for, each a sorted list."""
    if spec == "all":
        if len(clients) > MAX_ENUMERATED:
            raise ConfigError(f"--subsets all: {len(clients)} clients give 2^{len(clients)} runs; at most "
                              f"{MAX_ENUMERATED} clients (use a FILE of sampled subsets)")
        return [list(s) for r in range(len(clients)) for s in itertools.combinations(clients, r)]
    if not os.path.isfile(spec):
        raise InputError(f"--subsets {show(spec)}: neither 'all' nor a file of subsets (one per line)")
    check_input(spec, f"--subsets {spec}")
    with open(spec, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    kept = [parse_ids(line, f"--subsets {spec}, line {i + 1}") for i, line in enumerate(lines)]
    return [list(s) for s in dict.fromkeys(tuple(s) for s in kept)]


def subset_name(kept, n) -> str:
    """A subset's run folder: keep-0.3.5 (keep-none for the empty set); keep-all for every client."""
    if len(kept) == n:
        return "keep-all"
    return "keep-" + (".".join(str(c) for c in kept) if kept else "none")


def counterfactual_sets(cfg, *, drop_each=False, drop=None, subsets=None, clients=None, remove=False) -> list:
    """The sweep's sets (one per counterfactual) of the original config `cfg` (parsed YAML)."""
    n = int((cfg.get("partition") or {}).get("clients", 0))
    everyone = list(range(n))
    chosen = clients if clients is not None else everyone
    bad = [c for c in chosen + (drop or []) if c >= n]
    if bad:
        raise ConfigError(f"counterfactual: client ids {bad} are not below partition.clients ({n}) of the original")
    key = "counterfactual.remove" if remove else "counterfactual.drop"
    verb = "remove" if remove else "drop"
    if sum(bool(x) for x in (drop_each, drop, subsets)) != 1:
        raise ConfigError("counterfactual: give one of --drop-each, --drop IDS or --subsets all|FILE")
    if drop_each:
        return [{"name": f"{verb}-{c}", key: [c]} for c in chosen]
    if drop:
        return [{"name": f"{verb}-" + ".".join(map(str, drop)), key: list(drop)}]
    sets = []
    for kept in _subsets(subsets, chosen):
        if any(c not in chosen for c in kept):
            raise ConfigError(f"--subsets: subset {kept} names clients outside {chosen}")
        sets.append({"name": subset_name(kept, len(chosen)),
                     key: [c for c in everyone if c not in kept]})
    return sets


def spec_for(original, out, sets, *, from_round=0, ranks=None, record_updates=False) -> dict:
    """The sweep spec. The counterfactuals do not record their updates (`checkpoint.updates`, a run-time key: no
    result changes) unless `record_updates`: a 255-run enumeration of a recorded original would write 255
    recordings."""
    overrides = {"counterfactual.of": os.path.abspath(original), "counterfactual.from_round": from_round,
                 "checkpoint.updates": bool(record_updates)}
    spec = {"base": "original.yaml", "out": os.path.abspath(out), "sets": sets, "overrides": overrides}
    if ranks is not None:
        spec["ranks"] = ranks
    if from_round:
        spec["fork_from"] = f"{os.path.abspath(original)}@{from_round}"
    return spec


def _write(path, text):
    """Atomically (every rank writes the same text: a reader never sees half a file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def counterfactual_command(original, out, *, drop_each=False, drop=None, subsets=None, clients=None, remove=False,
                           from_round=0, ranks=None, record_updates=False, retry_failed=False, dry_run=False) -> int:
    from fedmpi.sweep.command import sweep_command

    if from_round < 0:
        raise ConfigError(f"--from-round {from_round}: must be a round number >= 0")
    cfg = read_original(original)
    if os.path.abspath(out) == os.path.abspath(original):
        raise ConfigError(f"--out {show(out)}: the original's own folder; give another folder for its counterfactuals")
    sets = counterfactual_sets(cfg, drop_each=drop_each, drop=drop, subsets=subsets, clients=clients, remove=remove)
    cfg.pop("out", None)
    os.makedirs(out, exist_ok=True)
    _write(os.path.join(out, "original.yaml"), yamlio.dump(cfg))
    spec = os.path.join(out, "counterfactuals.yaml")
    _write(spec, yamlio.dump(spec_for(original, out, sets, from_round=from_round, ranks=ranks,
                                      record_updates=record_updates)))
    return sweep_command(spec, retry_failed=retry_failed, dry_run=dry_run)
