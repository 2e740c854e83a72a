"""Tools and benchmarks find `mpiexec` beside the running Python (a venv's MPICH) before PATH, through
fedmpi.analysis.batch_report.require_mpiexec: `python bench/sweep.py` with the project's Python but without the
venv's bin on PATH gave a FileNotFoundError traceback for `mpiexec`."""

from __future__ import annotations

import ast
import sys

import pytest
from conftest import ROOT

from fedmpi.analysis import batch_report

SCRIPTS = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("tools/*.py")])


def _docstrings(tree):
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                   ast.ClassDef)))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_launch_site_names_a_bare_mpiexec(script):
    """Every bench/*.py and tools/*.py: a string "mpiexec" in code is a launch (or a which() on PATH alone)
    that misses the venv's launcher when its bin is not on PATH; they take require_mpiexec's instead."""
    tree = ast.parse(script.read_text(), str(script))
    docs = _docstrings(tree)
    bare = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == "mpiexec"
            and id(n) not in docs]
    assert not bare, f"{script.relative_to(ROOT)}: a bare 'mpiexec' at line(s) {bare}; use require_mpiexec"


def test_the_launcher_beside_python_is_found_without_path_or_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    """H50, also seen: without the venv's bin on PATH."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(SystemExit) as stop:
        batch_report.require_mpiexec("bench/sweep.py", "or set MPIEXEC")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench/sweep.py: no mpiexec beside") and "MPIEXEC" in err
    launcher = tmp_path / "mpiexec"
    launcher.write_text("#!/bin/sh\n")
    launcher.chmod(0o755)
    assert batch_report.require_mpiexec("bench/sweep.py") == str(launcher)
