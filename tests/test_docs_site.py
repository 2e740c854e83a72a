"""The documentation site (mkdocs.yml, `make docs`): every config key carries a docstring, the generated
references name every key, command and option, the site builds strictly, and offline."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import tool_module

ROOT = Path(__file__).resolve().parents[1]
reference = tool_module("docs_reference", "test_docs")
cli_reference = tool_module("docs_cli", "test_docs")
hooks = tool_module("docs_hooks", "test_docs")


def test_every_config_key_and_every_algorithm_key_has_a_docstring():
    keys = reference.all_keys()
    assert len(keys) > 150
    missing = sorted({k.dotted for k in keys if not k.doc.strip()})
    assert missing == [], f"config keys without a docstring (the string under the field): {missing}"


def test_every_registered_algorithm_has_its_keys_in_the_reference():
    from fedmpi.algorithms.registry import REGISTRY

    listed = {name for name, _, _ in reference.algorithms()}
    assert listed == set(REGISTRY)
    for name, algo, keys in reference.algorithms():
        own = {f.name for f in dataclasses.fields(algo.Keys)} - {"name"}
        assert {k.dotted for k in keys} == {f"algorithm.{f}" for f in own}, name


def test_the_config_reference_names_every_key_of_every_section():
    page = reference.config_markdown()
    absent = [k.dotted for k in reference.all_keys() if f"`{k.dotted}`" not in page]
    assert absent == []
    for name, _, leaves in reference.sections():
        if leaves and name != reference.TOP_LEVEL:
            assert f"## `{name}`" in page, name


def test_the_keys_each_choice_reads_are_keys_of_its_section():
    """The registries' USES declarations name real keys (else the reference would list a key that does not exist)."""
    known = {k.dotted for k in reference.all_keys()}
    for key, section, declared in reference.CHOICES:
        choices = declared()
        assert choices, key
        for choice, used in choices.items():
            for name in used:
                dotted = f"{section}.{name.split('[')[0]}"
                prefixes = ("client.", "server.") if section == "lr_schedule" else ("",)
                assert any(p + dotted in known for p in prefixes), (key, choice, dotted)


def test_a_range_and_a_default_are_shown_as_declared():
    by_key = {k.dotted: k for k in reference.all_keys()}
    assert by_key["rounds"].default == "100" and "[0, 1e+06]" in by_key["rounds"].range
    assert by_key["server.betas"].default == "[0.9, 0.99]"
    assert by_key["server.robust.beta"].range.startswith("a number in [0, 0.5)")
    assert by_key["server.sampling"].type == "one of fixed, poisson"
    assert by_key["client.steps"].type == "an integer or null"


def test_the_cli_reference_names_every_subcommand_and_option_and_the_tools_options():
    page = cli_reference.cli_markdown()
    found = cli_reference.commands()
    lines = [line for line, _ in found]
    assert {"fedmpi run", "fedmpi sweep", "fedmpi report", "fedmpi verify", "fedmpi export",
            "fedmpi data shakespeare"} <= set(lines)
    tools = cli_reference.tool_parsers()
    assert {"python tools/reproduce.py", "python tools/run_batch.py", "python tools/sweep.py"} <= {t for t, _ in tools}
    for line, parser in found + tools:
        section = page.split(f"## `{line}`", 1)[1].split("\n#", 1)[0]
        for action in cli_reference.arguments(parser):
            for name in action.option_strings or [action.metavar or action.dest]:
                assert f"`{name}" in section or f", {name}" in section, (line, name)
        assert isinstance(parser, argparse.ArgumentParser)


def test_the_reference_pages_hold_the_markers_the_hook_replaces():
    for page, name in (("config.md", "config"), ("cli.md", "cli")):
        text = (ROOT / "docs" / "reference" / page).read_text()
        assert hooks.marker(name) in text
        expanded = hooks.expand(text)
        assert hooks.marker(name) not in expanded and len(expanded) > len(text) + 1000


def _mkdocs_config():
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may hold mkdocs' own tags (!ENV, !relative); read them as plain values.
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_the_site_is_built_offline_and_strictly():
    config = _mkdocs_config()
    assert config["theme"]["font"] is False     # no Google Fonts fetched by the pages
    names = {p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]}
    assert not names & {"social", "privacy", "optimize", "offline-downloads"}, names
    assert config["hooks"] == ["tools/docs_hooks.py"]
    for kind in ("nav", "links"):
        assert set(config["validation"][kind].values()) == {"warn"}, kind
    assert set(config["validation"]["links"]) >= {"not_found", "unrecognized_links", "anchors"}
    assert config["validation"]["nav"]["omitted_files"] == "warn"
    makefile = (ROOT / "Makefile").read_text()
    assert "mkdocs build --strict --site-dir site" in makefile and "site/" in (ROOT / ".gitignore").read_text()


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (the docs extra)")
@pytest.mark.timeout(900)
def test_mkdocs_build_strict_succeeds(tmp_path):
    path = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR", "  - "))]
    assert done.returncode == 0, "\n".join(warnings) or done.stderr[-3000:]
    for page in ("config", "cli", "python-api"):
        html = (tmp_path / "site" / "reference" / f"{page}.html").read_text()
        assert "<table>" in html or "doc-object" in html, page
    # Offline: no page fetches a web font or a script from a CDN.
    for html_file in (tmp_path / "site").rglob("*.html"):
        text = html_file.read_text()
        assert not any(host in text for host in ("fonts.googleapis", "fonts.gstatic", "cdn.jsdelivr", "unpkg.com",
                                                 "cdnjs.")), html_file
    api = (tmp_path / "site" / "reference" / "python-api.html").read_text()
    for name in ("simulate", "paper_table", "AlgorithmKeys", "UploadStage", "Participation", "ModelAttack"):
        assert name in api, name
