"""Every script in tools/ and bench/ writes only where it is told: no default output inside the checkout or the
package (fedmpi.core.tool_outputs). `python tools/personalization.py --from MYRUNS`, started from another
folder, replaced the checkout's published docs/results/reproduction_personalization.csv (16 rows by 3): its --csv
defaulted to it; tools/secagg_bits.py and bench/sweep.py resolved their relative defaults in the checkout
(their launches run there).

The scripts are found by globbing tools/*.py and bench/*.py: a new script with a `__main__` block must be
given its cheapest real invocation below (or a reason), else test_every_script_is_covered fails. Each is then
started from a scratch folder and, where it has a default output, from inside the checkout, and the checkout
(git's view of it with ignored files, plus the hashes of docs/ and README.md) must be unchanged."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SCRIPTS = sorted(p.relative_to(ROOT).as_posix() for folder in ("tools", "bench")
                 for p in (ROOT / folder).glob("*.py") if "__main__" in p.read_text())

# A script's cheapest run that reaches its decision of where to write, from a scratch folder. EMPTY stands for
# an empty folder there (no runs): the scripts that read runs decide their outputs before reading them.
EMPTY = "EMPTY"
FROM_SCRATCH = {
    "tools/architecture_counts.py": ["--no-trace"],
    "tools/compare.py": [EMPTY],
    "tools/contribution_study.py": [EMPTY, EMPTY, "--out", "study"],
    "tools/curves.py": [EMPTY, "--out", "curves.png"],
    "tools/deploy_report.py": ["--report-only"],
    "tools/lora_study.py": [EMPTY, "--plot", "study.png"],
    "tools/personalization.py": ["--from", EMPTY],
    "tools/privacy_report.py": ["--report-only"],
    "tools/reproduce.py": ["--paper", "zhao", "--runs", EMPTY],
    "tools/robustness.py": ["--runs", EMPTY],
    "tools/run_batch.py": ["absent.yaml"],
    "tools/secagg_costs.py": ["--dims", "64", "--cohort", "3", "--repeat", "1"],
    "tools/sweep.py": [EMPTY],
    "tools/tokenize_instructions.py": ["--model", EMPTY, "--data", EMPTY, "--out", "sft.h5"],
    "tools/unlearning_study.py": [EMPTY, "--forget", "0", "--out", "unlearning"],
    "bench/hierarchy.py": ["--mpiexec", "false", "--rounds", "1"],
    "bench/kernels.py": ["--models", "cnn_mnist", "--repeats", "1"],
}
# Scripts whose work is long (runs under mpiexec, a data build): their `parse` places every output, checked
# in-process from the scratch folder.
PARSED = {"tools/fedskip_shakespeare_full.py": ("data", "out", "csv", "png"), "tools/secagg_bits.py": ("out",),
          "bench/sweep.py": ("out",), "bench/counterfactual_launch.py": ("out",)}
# Long scripts whose only outputs are named by the user or a temporary folder (test_no_argparse_default...
# checks the defaults they declare); the ones with a default in the working folder are refused inside the
# checkout below.
LONG = {
    "tools/local_eval_cost.py": "two in-process runs, nothing written",
    "tools/pretrain_char_lm.py": "pretraining; --out required and refused inside the checkout "
                                 "(tests/test_pretrain_char_lm.py)",
    "tools/tracking_cost.py": "runs with trackers; default --out in the temporary folder",
    "bench/bench.py": "the benchmark; --out a temporary folder, --json and --markdown named",
    "bench/gpu_check.py": "the GPU check (tests/test_gpu_check.py runs --dry-run); a temporary folder",
    "bench/large_model.py": "a temporary folder; --json named",
    "bench/lora_bench.py": "a temporary folder; --json named",
    "bench/lora_memory.py": "prints its figures; its runs in a temporary folder, removed at the end",
    "bench/robust_memory.py": "prints its figures",
    "bench/shakespeare_setup.py": "--data defaults to /tmp/shakespeare-full; --json named",
    "bench/w2_ab.py": "a temporary folder",
    "bench/w6.py": "a temporary folder unless --out",
    "bench/wire_accuracy.py": "runs every workload at three dtypes; its --out is refused inside the checkout below",
}
# Started from inside the checkout with their outputs left out: exit 2, one line naming the options.
INSIDE = {
    "tools/personalization.py": (["--from", "runs"], ["--csv"]),
    "tools/reproduce.py": (["--paper", "zhao"], ["--docs"]),
    "tools/robustness.py": ([], ["--docs"]),
    "tools/deploy_report.py": (["--report-only"], ["--runs", "--docs"]),
    "tools/privacy_report.py": (["--report-only"], ["--runs", "--docs"]),
    "tools/fedskip_shakespeare_full.py": ([], ["--data", "--out", "--csv", "--png"]),
    "tools/secagg_bits.py": ([], ["--out"]),
    "tools/tokenize_instructions.py": (["--model", "absent", "--data", "absent", "--out", "sft.h5"], ["--out"]),
    "bench/hierarchy.py": (["--mpiexec", "false"], ["--out"]),
    "bench/sweep.py": (["--quick"], ["--out"]),
    "bench/counterfactual_launch.py": (["--quick"], ["--out"]),
    "tools/contribution_study.py": (["absent", "absent"], ["--out"]),
    "tools/unlearning_study.py": (["absent", "--forget", "0"], ["--out"]),
    "bench/wire_accuracy.py": (["--rounds", "1"], ["--out"]),
}
TIMEOUT_S = 600          # generous: the machine may be loaded; a script that hangs fails here, not forever


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}


def _checkout():
    """{path: sha256} of the checkout's files git reports (changed, untracked and ignored ones, the caches of
    Python, pytest and ruff aside) and of every file under docs/ and README.md."""
    listed = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    caches = ("__pycache__", ".pytest_cache", ".ruff_cache")      # the tools' own, written by any test run
    paths = {line[3:] for line in listed if not any(cache in line for cache in caches)}
    paths |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*") if p.is_file()}
    paths.add("README.md")
    state = {}
    for rel in sorted(paths):
        path = ROOT / rel
        state[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "not a file"
    return state


@pytest.fixture(scope="module")
def before():
    return _checkout()


def _start(script, argv, cwd):
    return subprocess.run([sys.executable, str(ROOT / script), *argv], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def test_every_script_is_covered():
    covered = set(FROM_SCRATCH) | set(PARSED) | set(LONG)
    assert set(SCRIPTS) - covered == set(), "give each new script its cheapest run in FROM_SCRATCH (or PARSED)"
    assert covered - set(SCRIPTS) == set(), "scripts named here that are gone"
    assert set(INSIDE) <= set(SCRIPTS)


@pytest.mark.parametrize("script", sorted(FROM_SCRATCH))
def test_a_script_started_elsewhere_writes_nothing_in_the_checkout(script, tmp_path, before):
    (tmp_path / EMPTY).mkdir()
    proc = _start(script, FROM_SCRATCH[script], tmp_path)
    assert "Traceback" not in proc.stderr or script == "bench/hierarchy.py", proc.stderr[-2000:]
    assert _checkout() == before, f"{script} changed the checkout: {proc.stdout[-1000:]} {proc.stderr[-1000:]}"


def test_personalization_from_another_folder_writes_its_table_there(tmp_path, before):
    """The finding itself: `personalization.py --from MYRUNS` started elsewhere wrote the checkout's
    docs/results/reproduction_personalization.csv; its table now lands in the working folder."""
    from conftest import small_config, write_config

    from fedmpi.cli import main

    cfg = small_config(tmp_path / "myruns" / "fedper", rounds=1, data={"name": "synthetic"},
                       partition={"clients": 4, "scheme": "iid", "local_test": 0.2},
                       server={"clients_per_round": 2}, algorithm={"name": "fedper"}, model={"name": "mlp"},
                       eval={"local_every": 1, "local_clients": "all"})
    assert main(["run", str(write_config(tmp_path / "fedper.yaml", cfg))]) == 0
    (tmp_path / "elsewhere").mkdir()
    proc = _start("tools/personalization.py", ["--from", str(tmp_path / "myruns")], tmp_path / "elsewhere")
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (tmp_path / "elsewhere" / "reproduction_personalization.csv").read_text().splitlines()
    assert table[0].startswith("split,method,seeds") and len(table) == 2, table
    assert _checkout() == before


@pytest.mark.parametrize("script", sorted(PARSED))
def test_a_long_script_places_every_default_output_in_the_working_folder(script, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location(Path(script).stem + "_placed", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str((ROOT / script).parent))
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    args = module.parse([])
    for name in PARSED[script]:
        place = Path(getattr(args, name))
        assert place.is_absolute() and tmp_path in place.parents, (name, place)


@pytest.mark.parametrize("script", sorted(INSIDE))
def test_a_script_started_inside_the_checkout_refuses_to_choose_a_place_there(script, before):
    argv, options = INSIDE[script]
    proc = _start(script, argv, ROOT / "docs")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    assert all(option in lines[0] for option in options) and "inside" in lines[0], lines
    assert _checkout() == before


# Run in one process: each script's own argparse is stopped at parse time and its declared defaults reported.
DEFAULTS_DRIVER = r"""
import argparse, json, os, runpy, sys
found = {}
class Parsed(Exception):
    pass
def stop(self, *a, **k):
    found[current] = {a.dest: a.default for a in self._actions if a.dest != "help"}
    raise Parsed
for name in ("parse_args", "parse_known_args", "parse_intermixed_args"):
    setattr(argparse.ArgumentParser, name, stop)
for current in json.loads(sys.argv[1]):
    source = open(current).read()
    if "argparse" not in source and "fedmpi.cli" not in source:
        found[current] = {}             # no options at all (reads sys.argv itself): nothing declared
        continue
    sys.argv = [current]
    try:
        runpy.run_path(current, run_name="__main__")
    except (Parsed, SystemExit):
        pass
    except Exception as e:
        found[current] = repr(e)
print(json.dumps(found, default=repr))
"""


# The options that name what a script writes (or builds where missing, as --data).
OUTPUT_OPTIONS = {"out", "out_root", "csv", "png", "plot", "json", "markdown", "docs", "runs", "data"}


def test_no_argparse_default_names_a_place_in_the_checkout(tmp_path):
    """Every script's declared output defaults, read at parse time from a scratch folder: none is a path inside
    the checkout (docs/..., ROOT/runs/...)."""
    scripts = [str(ROOT / s) for s in SCRIPTS]
    proc = subprocess.run([sys.executable, "-c", DEFAULTS_DRIVER, json.dumps(scripts)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert set(found) == set(scripts), set(scripts) - set(found)
    inside = []
    for script, defaults in found.items():
        assert isinstance(defaults, dict), (script, defaults)
        for dest, default in defaults.items():
            if dest not in OUTPUT_OPTIONS:
                continue            # inputs (a spec, a config) may well be the checkout's own
            for value in default if isinstance(default, list) else [default]:
                if isinstance(value, str) and value:
                    place = Path(tmp_path, value).resolve()
                    if place == ROOT or ROOT in place.parents:
                        inside.append((script, dest, value))
    assert inside == [], inside
