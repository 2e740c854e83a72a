"""The architecture's counts, measured from the code (run before and after a change):

  config-taking functions   functions (and methods) with a parameter named `cfg` or `config`, by package:
                            each reads the whole Config, a dependency import-linter cannot see
  stored-config reads       attribute reads of `.cfg.` on an object (a part holding the whole Config)
  name dispatches           comparisons of a component-choosing key with a string literal
                            (`cfg.server.aggregator == "fltrust"`, `keys.name in ("a", "b")`)
  RoundParts fields         the fields of fedmpi.round.engine.RoundParts
  files in one round        the fedmpi files whose code runs during round 2 of an in-process FedAvg run

    python tools/architecture_counts.py [--no-trace]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedmpi"
CHOOSING_KEYS = {"name", "aggregator", "secure_aggregation", "participation", "optimizer", "scheme", "protocol",
                 "compression", "mode", "kind"}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def package_of(path):
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else "(top)"


def config_functions():
    by = Counter()
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
                if names & {"cfg", "config"}:
                    by[package_of(path)] += 1
    return by


# The packages whose functions take sections and values, never the whole config, and the entry points
# that may (the data loader's, the assembler).
SECTION_ONLY = ("core", "mpi", "plans", "uploads", "robust", "data", "round")
WHOLE_CONFIG_ALLOWED = {("data/load.py", "load_dataset"), ("data/shared.py", "load_shared"),
                        ("round/experiment.py", "*")}


def whole_config_functions():
    """`path:line function` of every function in SECTION_ONLY taking `cfg`/`config`, less the allowed."""
    found = []
    for path, tree in modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if package_of(path) not in SECTION_ONLY:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
                allowed = (rel, node.name) in WHOLE_CONFIG_ALLOWED or (rel, "*") in WHOLE_CONFIG_ALLOWED
                if names & {"cfg", "config"} and not allowed:
                    found.append(f"fedmpi/{rel}:{node.lineno} {node.name}")
    return found


def stored_config_reads():
    count = 0
    for _, tree in modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "cfg"):
                count += 1
    return count


def _choosing(node):
    return isinstance(node, ast.Attribute) and node.attr in CHOOSING_KEYS


def _literal(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)


def name_dispatches():
    by = Counter()
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and len(node.ops) == 1:
                left, right = node.left, node.comparators[0]
                if (_choosing(left) and _literal(right)) or (_choosing(right) and _literal(left)):
                    by[package_of(path)] += 1
    return by


def round_parts_fields():
    sys.path.insert(0, str(ROOT))
    from fedmpi.round.engine import RoundParts
    return len(dataclasses.fields(RoundParts))


def files_in_one_round():
    """Round 2 of a small in-process FedAvg run (round 1 warms the caches), traced by file."""
    sys.path.insert(0, str(ROOT))
    import fedmpi
    from fedmpi.round import engine

    seen, plain = set(), engine.run_round

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(str(PACKAGE)):
            seen.add(os.path.relpath(name, ROOT))
        return None

    def traced(parts, t, **kw):
        if t != 2:
            return plain(parts, t, **kw)
        sys.setprofile(tracer)
        try:
            return plain(parts, t, **kw)
        finally:
            sys.setprofile(None)

    engine.run_round = traced
    import fedmpi.run.launch as launch
    launch_run_round = getattr(launch, "run_round", None)
    if launch_run_round is not None:
        launch.run_round = traced
    try:
        fedmpi.simulate({"seed": 1, "rounds": 3, "data": {"name": "mnist5k"}, "model": {"name": "lr"},
                         "partition": {"clients": 6, "scheme": "iid"}, "server": {"clients_per_round": 3},
                         "client": {"lr": 0.05, "batch_size": 20, "epochs": 1}, "runtime": {"threads": 1},
                         "algorithm": {"name": "fedavg"}})
    finally:
        engine.run_round = plain
        if launch_run_round is not None:
            launch.run_round = launch_run_round
    return sorted(seen)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-trace", action="store_true", help="skip the traced round (no torch import)")
    ap.add_argument("--files", action="store_true", help="list the files of the traced round")
    args = ap.parse_args(argv)
    cf = config_functions()
    print(f"config-taking functions: {sum(cf.values())} ({', '.join(f'{k} {v}' for k, v in cf.most_common())})")
    print(f"whole-config functions in {'/'.join(SECTION_ONLY)} (less the loader's entry and the assembler): "
          f"{len(whole_config_functions())}")
    print(f"stored-config reads (.cfg.): {stored_config_reads()}")
    nd = name_dispatches()
    print(f"name dispatches: {sum(nd.values())} ({', '.join(f'{k} {v}' for k, v in nd.most_common())})")
    if not args.no_trace:
        print(f"RoundParts fields: {round_parts_fields()}")
        files = files_in_one_round()
        print(f"files run in one FedAvg round: {len(files)}")
        if args.files:
            print("\n".join(f"  {f}" for f in files))


if __name__ == "__main__":
    main()
