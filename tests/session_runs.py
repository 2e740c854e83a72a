"""One launch per -n for the MPI runs of several test files (each launch pays the torch import on every rank,
more than a small run costs).

A test file registers a plan at import time:

    @session_runs.plan
    def my_runs(base):                 # base: a fresh folder for this file's runs
        ...write configs under base...
        return {3: [step, ...], 1: [step, ...]}, value

and its tests take `session_runs.result(request, my_runs)` (through a module fixture): `value`, once every
registered plan's steps have run. The steps of every plan whose file has a selected test run together, one
launch per -n, at -n 3 first, then 2, then 1 (so that a plan may resume at -n 1 a copy of what it ran at
-n 3). A step is what `DRIVER` takes: ["run", ARGS...] runs `fedmpi run ARGS` (fedmpi.cli.main, exactly as
the command line does), ["sweep", CODE, ARGS...] `fedmpi sweep ARGS`, which must exit CODE (the launch is its
world: rank 0 dispatches), ["copy", SRC, DST] and ["truncate", FILE] are file steps on rank 0; a step may start
with a dict of environment variables ({name: value, or None to unset}) that apply to it alone (a PYTHONPATH
there also goes in front of the driver's sys.path for that step, so it imports plug-ins from there). Each run has
its own `out`, so runs cannot see each other's files; a failing step fails every plan of the launch, with
the launch's stderr. ["script", PATH, ARGS...] runs a Python file in the launch's processes (runpy, with
sys.argv = [PATH, ARGS...] and its folder first on sys.path, as `python PATH` runs it), for checks below
`fedmpi run` (what each rank sees of its node).

A plan may also live in a helper module shared by several test files (tests/extension_runs.py): it counts as
wanted wherever a selected test file imports that module (`import extension_runs as ext`).

A plan's key may also be `nodes(K, R)`, a launch of K nodes of R ranks each: MPI's own several nodes where
this machine allows (conftest.node_launch), else fedmpi's pretend nodes. Those launches run first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, mpiexec, node_launch

DRIVER = r"""
import json, os, shutil, sys
from mpi4py import MPI
from fedmpi.cli import main

base, base_path = dict(os.environ), list(sys.path)
for step in json.loads(sys.argv[1]):
    env = step.pop(0) if isinstance(step[0], dict) else {}
    os.environ.clear()
    os.environ.update(base)
    sys.path[:] = base_path
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if env.get("PYTHONPATH"):       # this process is already running: so that its imports see the step's folders
        sys.path[:0] = [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
    kind, rest = step[0], step[1:]
    if kind == "run":
        code = main(["run", *rest])
        if code:
            print(f"session_runs: fedmpi run {' '.join(rest)} exited {code}", file=sys.stderr)
            sys.exit(code)
    elif kind == "sweep":
        code = main(["sweep", *rest[1:]])
        if code != int(rest[0]):
            print(f"session_runs: fedmpi sweep {' '.join(rest[1:])} exited {code}, not {rest[0]}", file=sys.stderr)
            sys.exit(code or 1)
    elif kind == "script":
        import runpy
        sys.argv = list(rest)
        sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))     # as `python PATH` puts it there
        runpy.run_path(rest[0], run_name="__main__")
    elif MPI.COMM_WORLD.Get_rank() == 0:      # file steps on rank 0; the next run's collectives wait for it
        if kind == "copy":
            shutil.copytree(rest[0], rest[1])
        elif kind == "truncate":
            with open(rest[0], "r+b") as fh:
                fh.truncate(os.path.getsize(rest[0]) // 2)
"""

TIMEOUT_PER_RUN_S = 60       # a launch's timeout: this per `run` step (a loaded 2-core machine), at least 300 s
# pytest-timeout's limit (pyproject.toml, 300 s) covers a test's setup, where the first test to ask runs every
# selected file's launches: the MPI tests of files with a plan get this instead. A hung launch still ends at
# its own timeout above.
SHARED_SETUP_TIMEOUT_S = 2400

_PLANS = {}         # plan function's qualified name -> (module name, function)
_RESULTS = {}


def plan(fn):
    _PLANS[_key(fn)] = (fn.__module__, fn)
    return fn


def per_n(launch, ns=(1, 3)):
    """A plan from `launch(base, n) -> (steps, value)`, where a step is the argument list of one `fedmpi run`
    at -n n under the fresh folder `base`: the plan's value is {n: value}. For files whose runs are the same
    configs at each rank count."""
    def by_n(base):
        steps, values = {}, {}
        for n in ns:
            folder = base / f"n{n}"
            folder.mkdir()
            some, values[n] = launch(folder, n)
            steps[n] = [["run", *step] for step in some]
        return steps, values

    by_n.__module__, by_n.__name__, by_n.__qualname__ = launch.__module__, launch.__name__, launch.__qualname__
    return plan(by_n)


def _key(fn):
    return f"{fn.__module__}.{fn.__name__}"


def _step(step):
    out = [dict(step[0])] if isinstance(step[0], dict) else []
    return out + [str(a) for a in step[len(out):]]


def nodes(count, per_node):
    """A plan's key for a launch of `count` nodes of `per_node` ranks (see the module's docstring)."""
    return f"{count}x{per_node}"


def _nodes_of(key):
    """(nodes, ranks per node) of a `nodes` key, None for a plain rank count."""
    if isinstance(key, str):
        count, per_node = key.split("x")
        return int(count), int(per_node)
    return None


def _order(key):
    """Node launches first, then the rank counts from the largest (see the module's docstring)."""
    shape = _nodes_of(key)
    return (0, -shape[0] * shape[1]) if shape else (1, -key)


def launch(n, steps, timeout=None):
    """ONE launch of the DRIVER over `steps` (each as a plan's step): mpiexec -n `n`, or a `nodes(K, R)` key's
    launch; asserts exit 0. `timeout`: by default TIMEOUT_PER_RUN_S per `run` step, at least 300 s."""
    steps = [_step(s) for s in steps]
    if timeout is None:
        timeout = max(300, TIMEOUT_PER_RUN_S * sum(1 for s in steps if "run" in s[:2] or "sweep" in s[:2]))
    shape, env = _nodes_of(n), {}
    if shape:
        found = node_launch(*shape)
        prefix, env = list(found.argv), found.env
    else:
        prefix = [mpiexec(), "-n", str(n)]
    cmd = [*prefix, sys.executable, "-c", DRIVER, json.dumps(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    assert proc.returncode == 0, (f"session_runs: the -n {n} launch exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def result(request, fn):
    """The value `fn`'s plan returned, after the launches that ran its steps (and every other selected
    file's: the first file to ask runs them all)."""
    key = _key(fn)
    if key not in _RESULTS:
        factory = request.getfixturevalue("tmp_path_factory")
        wanted = set().union(*(_reached(item.module) for item in request.session.items
                               if getattr(item, "module", None)))
        todo = {k: f for k, (module, f) in _PLANS.items() if (module in wanted or k == key) and k not in _RESULTS}
        try:
            steps, values = {}, {}
            for k, f in todo.items():
                by_n, values[k] = f(factory.mktemp(f.__name__))
                for n, some in by_n.items():
                    steps.setdefault(n, []).extend(_step(s) for s in some)
            for n in sorted(steps, key=_order):
                launch(n, steps[n])
        except Exception as e:       # every plan of the batch fails with it, without launching it again
            values = {k: _Failed(e) for k in todo}
        _RESULTS.update(values)
    value = _RESULTS[key]
    if isinstance(value, _Failed):
        raise AssertionError(f"session_runs: the shared launches failed: {value.error}") from value.error
    return value


def allow_for_the_launches(items):
    """Raises the pytest-timeout limit of the MPI tests of files that registered a plan (conftest calls this
    from pytest_collection_modifyitems)."""
    import pytest

    modules = {module for module, _ in _PLANS.values()}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and modules & _reached(module) and item.get_closest_marker("mpi"):
            item.add_marker(pytest.mark.timeout(SHARED_SETUP_TIMEOUT_S))


def _reached(module):
    """The names of a test module and of the modules it imports as modules (a helper with a plan of its own)."""
    import types

    return {module.__name__} | {v.__name__ for v in vars(module).values() if isinstance(v, types.ModuleType)}


class _Failed:
    def __init__(self, error):
        self.error = error
