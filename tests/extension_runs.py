"""The -n 3 launch shared by the tests of the core's extension points (issue 11): server optimizers,
out-of-tree algorithms, the examples under examples/ and learning-rate schedules.

Launches are the cost under mpiexec (each pays the torch import on every rank), so every command below runs
in sequence in the -n 3 launch shared with other test files (tests/session_runs.py: this module's plan is
wanted wherever a selected test file imports it), once per test session:
  adam       fedavg + server.optimizer adam: the whole run, and a run stopped after HALF rounds then
             continued with --resume (moments must survive the checkpoint)
  scratch    examples/fedadam_scratch.py: FedAdam written as an algorithm (must equal `adam`)
  scaffold, control_variates   fedmpi's SCAFFOLD and examples/control_variates.py (must agree)
  external   a tiny algorithm in a package outside fedmpi (`extpkg.tiny:TinyMomentum`) with client and
             server state and both lr schedules: whole run, and half + --resume
  entry_point  the same class found through the entry-point group `fedmpi.algorithms`
  context    an algorithm outside fedmpi written against the AlgorithmContext (`extpkg.context:Coverage`:
             the seed, the participation history on the clients and on the server, the client learning-rate
             schedule, N), with client and server state: whole run, and half + --resume
  nesterov   examples/nesterov.py as server.optimizer (a plug-in with moments): whole run, half + --resume

The external package and its `*.dist-info` (METADATA + entry_points.txt, so that importlib.metadata finds
the entry point without pip) are written into a temporary folder that goes on PYTHONPATH.
"""

from __future__ import annotations

import os
import textwrap

import session_runs
from conftest import ROOT, read_global, small_config, write_config

R, HALF = 6, 3
EVERY = 2          # checkpoint cadence: the half run stops at round 3, between two checkpoints of the whole run

TINY = '''\
"""A tiny algorithm outside fedmpi: each client uploads the mean of its update and its previous one (kept
between rounds), and the server moves by a momentum of the averaged uploads. Its class and its keys are all
there is; it uses fedmpi's public algorithm API only."""

from dataclasses import dataclass

import torch

from fedmpi.algorithms.base import AlgorithmKeys, Reduce
from fedmpi.algorithms.state import ClientVectors, ServerVectors


@dataclass(frozen=True)
class TinyMomentumKeys(AlgorithmKeys):
    name: str = "tiny_momentum"
    beta: float = 0.5
    """Momentum of the server's velocity."""


class TinyMomentum(Reduce):
    name = "tiny_momentum"
    Keys = TinyMomentumKeys
    keeps_client_state = True

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.last = ClientVectors("last")                            # each client's previous update
        self.velocity = ServerVectors(dtype=torch.float64, m=self.dim)   # the server's momentum

    def accumulate(self, run, down, model, acc):
        delta = model.vec - down[: self.dim]
        previous = self.last.or_zeros(run.cid, self.dim, model.device)
        acc[: self.dim].add_((delta + previous) / 2, alpha=run.weight)
        self.last[run.cid] = delta.clone()
        return run.weight

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        m = self.velocity.get("m", x.device)
        m.mul_(self.keys.beta).add_(up_sum[: self.dim] / weight_sum)
        return m.clone()
'''

BROKEN = '''\
"""Classes that break the contract they declare; fedmpi must refuse each with exit 2, naming the problem."""

from fedmpi.algorithms.base import Reduce
from fedmpi.algorithms.state import ClientVectors


class _Mean(Reduce):
    def accumulate(self, run, down, model, acc):
        acc[: self.dim].add_(model.vec - down[: self.dim], alpha=run.weight)
        return run.weight

    def aggregate(self, x, up_sum, weight_sum, round_):
        return up_sum[: self.dim] / weight_sum if weight_sum > 0 else None


class VectorizableWithHook(_Mean):
    """Declares vectorizable but has a gradient hook (batched clients would skip it)."""

    name = "vectorizable_with_hook"
    vectorizable = True

    def grad_hook(self, params, grad):
        grad.mul_(0.5)


class NoAccumulate(Reduce):
    """A REDUCE algorithm without its `accumulate` hook."""

    name = "no_accumulate"

    def aggregate(self, x, up_sum, weight_sum, round_):
        return None


class UndeclaredClientState(_Mean):
    """Keeps per-client vectors without declaring keeps_client_state (they would be lost when its clients
    are dealt to other ranks)."""

    name = "undeclared_client_state"

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.memory = ClientVectors("memory")


class VectorizableWithInstanceHook(_Mean):
    """Declares vectorizable and passes the class-level check, but sets a gradient hook on the instance in
    __init__ (batched clients would never call it)."""

    name = "vectorizable_with_instance_hook"
    vectorizable = True

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.grad_hook = lambda params, grad: grad.mul_(0.5)
'''

CONTEXT = '''\
"""An algorithm outside fedmpi written against the AlgorithmContext: it reads the run's seed, N, the client
learning-rate schedule and the participation history, never the config.

A client that also trained in the previous round (context.history, on the client's rank) weighs
(1 + repeat_bonus) times more, and every upload carries a seeded jitter in [0.5, 1.5) from
(context.seed, CLIENT, round, cid). Each client uploads the mean of its update and its previous one (kept
between rounds). The server counts per client how often it trained (context.history on rank 0, N =
context.num_clients entries), logs the fraction of clients seen so far (/metrics/coverage) and scales the
averaged upload by the client schedule's factor context.client_lr(t) / context.client.lr.
"""

from dataclasses import dataclass

import numpy as np
import torch

from fedmpi.core import rng
from fedmpi.algorithms.base import AlgorithmKeys, Reduce
from fedmpi.algorithms.state import ClientVectors, ServerVectors

JITTER_KEY = 21


@dataclass(frozen=True)
class CoverageKeys(AlgorithmKeys):
    name: str = "coverage"
    repeat_bonus: float = 0.5
    """Extra weight of a client that also trained in the previous round."""


class Coverage(Reduce):
    name = "coverage"
    Keys = CoverageKeys
    keeps_client_state = True

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.last = ClientVectors("last")                                             # previous update
        self.counts = ServerVectors(dtype=torch.float64, times=context.num_clients)   # rounds trained
        self.coverage = float("nan")

    def accumulate(self, run, down, model, acc):
        ctx = self.context
        again = run.round > 0 and run.cid in ctx.history.selected(run.round - 1)
        jitter = 0.5 + rng.stream(ctx.seed, rng.CLIENT, run.round, run.cid, JITTER_KEY).random()
        w = run.weight * (1.0 + self.keys.repeat_bonus * again) * jitter
        delta = model.vec - down[: self.dim]
        previous = self.last.or_zeros(run.cid, self.dim, model.device)
        acc[: self.dim].add_((delta + previous) / 2, alpha=w)
        self.last[run.cid] = delta.clone()
        return w

    def aggregate(self, x, up_sum, weight_sum, round_):
        times = self.counts.get("times", x.device)
        times[torch.as_tensor(np.asarray(self.context.history.selected(round_)), device=x.device)] += 1
        self.coverage = float((times > 0).double().mean())
        if weight_sum <= 0:
            return None
        factor = self.context.client_lr(round_) / self.context.client.lr
        return up_sum[: self.dim] / weight_sum * factor

    def round_metrics(self):
        return {"coverage": self.coverage}
'''

ENTRY_POINT = "tiny_momentum"
DIST_INFO = "tiny_fedmpi_algorithms-0.1.dist-info"


def write_external_package(site):
    """extpkg/ (the tiny algorithm and the broken classes) and its dist-info under the folder `site`."""
    pkg = site / "extpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""An algorithm package outside fedmpi (written by the tests)."""\n')
    (pkg / "tiny.py").write_text(TINY)
    (pkg / "broken.py").write_text(BROKEN)
    (pkg / "context.py").write_text(CONTEXT)
    info = site / DIST_INFO
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-fedmpi-algorithms\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [fedmpi.algorithms]
        {ENTRY_POINT} = extpkg.tiny:TinyMomentum
        """))
    return site


# name -> sections that differ from conftest.small_config
ADAM = {"server": {"clients_per_round": 5, "optimizer": "adam", "lr": 0.01, "betas": [0.9, 0.99], "tau": 1e-3}}
SCHEDULED_CLIENT = {"name": "exponential", "gamma": 0.8}
SCHEDULED_SERVER = {"name": "step", "gamma": 0.5, "step_rounds": 2, "warmup_rounds": 2}
RUNS = {
    "adam": ADAM,
    "scratch": {"algorithm": {"name": "examples.fedadam_scratch:FedAdamScratch", "lr": 0.01, "beta1": 0.9,
                              "beta2": 0.99, "tau": 1e-3}},
    "scaffold": {"algorithm": {"name": "scaffold"}},
    "control_variates": {"algorithm": {"name": "examples.control_variates:ControlVariates"}},
    "external": {"algorithm": {"name": "extpkg.tiny:TinyMomentum", "beta": 0.5},
                 "client": {"lr": 0.05, "batch_size": 20, "epochs": 1, "lr_schedule": SCHEDULED_CLIENT},
                 "server": {"clients_per_round": 5, "lr": 1.0, "lr_schedule": SCHEDULED_SERVER}},
}
RUNS["entry_point"] = {**RUNS["external"], "algorithm": {"name": ENTRY_POINT, "beta": 0.5}}
RUNS["context"] = {**RUNS["external"], "algorithm": {"name": "extpkg.context:Coverage", "repeat_bonus": 0.5}}
RUNS["nesterov"] = {"server": {"clients_per_round": 5, "optimizer": "examples.nesterov:Nesterov", "momentum": 0.9,
                               "lr": 0.5}}
RUNS["norm_clip"] = {"uploads": {"stages": ["examples.norm_clip_stage:NormClip"], "keys": {"max_norm": 0.05}}}
RUNS["cyclic"] = {"participation": {"name": "examples.cyclic_participation:Cyclic", "keys": {"groups": 3}}}
RESUMED = ("adam", "external", "context", "nesterov", "norm_clip", "cyclic")


def config_of(name, out):
    return small_config(out, rounds=R, checkpoint={"every": EVERY, "keep": 10}, **RUNS[name])


@session_runs.plan
def launch(base):
    """Writes the package and the configs under `base`; the steps of the -n 3 launch that runs them, and
    {name: run folder} with 'NAME-resumed' for the runs continued with --resume, plus 'site' (the package's
    folder) and 'configs' ({name: config path})."""
    site = write_external_package(base / "site")
    env = {"PYTHONPATH": pythonpath(site)}
    steps, out, configs = [], {}, {}
    for name in RUNS:
        out[name] = base / name
        configs[name] = write_config(base / f"{name}.yaml", config_of(name, out[name]))
        steps.append([env, "run", configs[name]])
        if name in RESUMED:
            out[f"{name}-resumed"] = half = base / f"{name}-resumed"
            steps += [[env, "run", configs[name], f"out={half}", f"rounds={HALF}"],
                      [env, "run", configs[name], f"out={half}", "--resume", f"rounds={R}"]]
    return {3: steps}, {**out, "site": site, "configs": configs}


def pythonpath(site):
    """The package's folder, the repository root (for examples/) and the fedmpi checkout, on every rank."""
    return os.pathsep.join([str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def shared(request):
    """The launch's results (`request`: a test's or fixture's), run once per test session with the other
    selected files' plans, whichever test module asks first."""
    return session_runs.result(request, launch)


def assert_n3_is_in_process_and_resumes(name, request, tmp_path_factory):
    """Run `name` of the shared launch: at -n 3 the model of the same config in-process (-n 1), and the run
    stopped at HALF and continued with --resume bit-identical to the whole one."""
    import numpy as np

    import fedmpi

    runs = shared(request)
    whole = read_global(runs[name])
    assert np.array_equal(whole, read_global(runs[f"{name}-resumed"]))
    assert np.array_equal(whole, fedmpi.simulate(config_of(name, tmp_path_factory.mktemp("alone"))).model)
