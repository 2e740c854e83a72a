"""A counterfactual differs from its original in the declared client and in nothing else, bit for bit, for every
registered algorithm a counterfactual runs with (the others are refused, each naming why: test_counterfactual.py).

For each one, from the registry contract's case of it (tests/test_registry_contract.py: 11 of 12 clients a round,
the paths that depend on a rank's clients), client K:
- `counterfactual.drop: [K]` at -n 1, 2 and 3 gives the per-round models of the run that leaves K out of the
  clients that train (the `WithoutClient` provider of tests/counterfactual_plugins.py): K trains and its update
  is thrown away, and that training leaves no trace in any other client's batches, the selection, the noise or
  any state;
- for the algorithms whose upload is the weighted model update alone (FedAvg, FedProx), the original in which K's
  upload counts for nothing (`NullUpload`: zero update, zero weight) equals the counterfactual;
- a stateful algorithm's counterfactual resumed from its checkpoint equals the uninterrupted one;
- a change from round 1 by a fork from the original's checkpoint (the prefix not recomputed) equals the same change
  run from the start (`counterfactual.from_round: 1`), at -n 1 and 3, and its first round is the original's.
All runs share the suite's launches (tests/session_runs.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import session_runs
from conftest import ROOT, read_global, read_metrics, write_config
from test_registry_contract import FULL, HALF, LORA, NS, cases, stateful, write_data

from fedmpi.algorithms.base import REDUCE
from fedmpi.algorithms.registry import REGISTRY, builtin_names
from fedmpi.counterfactual.checks import WHY_NOT

pytestmark = pytest.mark.mpi

K = 5
PLUGINS = {"PYTHONPATH": str(ROOT / "tests")}
NULL = {"uploads": {"stages": ["counterfactual_plugins:NullUpload"], "keys": {"null_client": K}}}
WITHOUT = {"participation": {"name": "counterfactual_plugins:WithoutClient", "keys": {"absent": K}}}
DROP = {"counterfactual": {"drop": [K], "of": "original"}}
ZERO_UPDATE = ("fedavg", "fedprox")


def counterfactual_algorithms():
    """The registered algorithms whose family takes a counterfactual (fedmpi.counterfactual.checks)."""
    return [n for n in builtin_names() if REGISTRY[n].protocol == REDUCE]


def _with(cfg, *extras):
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in cfg.items()}
    for extra in extras:
        for key, value in extra.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


@session_runs.plan
def counterfactual_runs(base):
    write_data(base / "data")
    built = cases(base / "data")
    steps = {n: [] for n in NS}

    def add(n, name, cfg, *extra_steps):
        path = write_config(base / f"{name}.yaml", {**cfg, "out": str(base / name)})
        steps[n].append([PLUGINS, "run", path, "--overwrite", *extra_steps])
        return path

    names = counterfactual_algorithms()
    for name in names:
        cfg = built[f"algorithm-{name}"]
        cfg.pop("checkpoint", None)
        add(1, f"without-{name}", _with(cfg, WITHOUT))
        for n in NS:
            add(n, f"drop-n{n}-{name}", _with(cfg, DROP))
        if name in ZERO_UPDATE:
            add(1, f"null-{name}", _with(cfg, NULL))
        if stateful(REGISTRY[name]) or cfg["model"]["name"] == LORA["model"]["name"]:
            half = _with(cfg, DROP, {"checkpoint": {"every": HALF}})
            add(3, f"half-{name}", half)
            full = add(3, f"full-{name}", {**half, "rounds": FULL})
            steps[3] += [["copy", base / f"half-{name}", base / f"resumed-{name}"],
                         [PLUGINS, "run", full, f"out={base / f'resumed-{name}'}", "--resume"]]
    # The fork: an original with a checkpoint after round 1, a fork from it that drops K from round 1 on, and the
    # same change run from the start.
    fedavg = _with(built["algorithm-fedavg"], {"checkpoint": {"every": 1}})
    for n in (1, 3):
        add(n, f"original-n{n}", fedavg)
        changed = _with(fedavg, {"counterfactual": {"drop": [K], "from_round": 1}})
        add(n, f"from1-n{n}", changed)
        path = write_config(base / f"fork-n{n}.yaml", {**changed, "out": str(base / f"fork-n{n}")})
        steps[n].append(["run", path, "--overwrite", "--fork-from", f"{base / f'original-n{n}'}@1"])
    return steps, (base, names)


@pytest.fixture(scope="module")
def runs(request):
    return session_runs.result(request, counterfactual_runs)


def _shas(path):
    metrics, attrs = read_metrics(path)
    assert attrs["status"] == "finished", path
    return metrics["model_sha256"], attrs


@pytest.mark.parametrize("name", counterfactual_algorithms())
def test_dropping_a_client_changes_nothing_but_its_upload(runs, name):
    base, _ = runs
    reference, _ = _shas(base / f"without-{name}")
    for n in NS:
        shas, attrs = _shas(base / f"drop-n{n}-{name}")
        assert attrs["counterfactual_change"] == f"drop [{K}]" and attrs["counterfactual_of"].endswith("original")
        differ = np.flatnonzero(shas != reference)
        assert not differ.size, f"{name}: -n {n} differs from the run without client {K} from round {differ[0]}"
    assert np.array_equal(read_global(base / f"drop-n1-{name}"), read_global(base / f"without-{name}"))


@pytest.mark.parametrize("name", ZERO_UPDATE)
def test_a_client_whose_upload_counts_for_nothing_is_its_own_counterfactual(runs, name):
    base, _ = runs
    original, _ = _shas(base / f"null-{name}")
    dropped, _ = _shas(base / f"drop-n1-{name}")
    assert np.array_equal(original, dropped), name


def test_stateful_counterfactuals_resume_to_the_uninterrupted_run(runs):
    base, names = runs
    checked = [n for n in names if (base / f"full-{n}").exists()]
    assert checked, "no stateful algorithm was checked"
    for name in checked:
        full, _ = _shas(base / f"full-{name}")
        resumed, attrs = _shas(base / f"resumed-{name}")
        assert f"from round {HALF}" in attrs["resumes"], name
        assert len(full) == FULL and np.array_equal(full, resumed), name


@pytest.mark.parametrize("n", (1, 3))
def test_a_fork_from_round_r_equals_the_change_run_from_the_start(runs, n):
    base, _ = runs
    original, _ = _shas(base / f"original-n{n}")
    straight, _ = _shas(base / f"from1-n{n}")
    forked, attrs = _shas(base / f"fork-n{n}")
    assert attrs["parent_round"] == 1 and attrs["counterfactual_change"] == f"drop [{K}] from round 1"
    assert forked[0] == original[0] and np.array_equal(forked, straight)
    assert straight[1] != original[1], "client K's upload changed nothing: the check would prove nothing"


def test_every_family_is_either_checked_or_refused():
    families = {REGISTRY[n].protocol for n in builtin_names()}
    assert families <= {REDUCE} | set(WHY_NOT), families
