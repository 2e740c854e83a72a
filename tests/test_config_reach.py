"""Issue 37: components get their own config sections as values. No function in fedmpi's core, mpi, plans,
uploads, robust, data or round packages takes the whole config (a parameter `cfg` or `config`), except the
data loader's entry points and the assembler (fedmpi/round/experiment.py); tools/architecture_counts.py
counts the same functions, so this test and the issue's figure cannot drift apart."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))

import architecture_counts  # noqa: E402 - the tool is not a package


def test_no_component_takes_the_whole_config():
    assert architecture_counts.whole_config_functions() == []


def test_the_count_sees_a_whole_config_parameter(tmp_path, monkeypatch):
    (tmp_path / "round").mkdir()
    (tmp_path / "round" / "x.py").write_text("def build(cfg, dim):\n    return cfg\n\ndef ok(server, dim):\n    pass\n")
    monkeypatch.setattr(architecture_counts, "PACKAGE", tmp_path)
    assert architecture_counts.whole_config_functions() == ["fedmpi/round/x.py:1 build"]
