"""mkdocs hook (mkdocs.yml `hooks:`): the generated parts of the reference pages, made when the site is built.

A page holds prose and a marker line; the marker is replaced by the text generated from the code, so the
reference cannot drift from it:
  <!-- generated: config -->    every config key (tools/docs_reference.py)
  <!-- generated: cli -->       every command and option (tools/docs_cli.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
for folder in (str(TOOLS), str(ROOT)):      # this tree's fedmpi and generators, before any installed copy
    if folder not in sys.path:
        sys.path.insert(0, folder)

import docs_cli  # noqa: E402 - after the path above
import docs_reference  # noqa: E402

GENERATORS = {"config": docs_reference.config_markdown, "cli": docs_cli.cli_markdown}


def marker(name) -> str:
    return f"<!-- generated: {name} -->"


def expand(markdown) -> str:
    """`markdown` with each marker line replaced by its generated text."""
    for name, generate in GENERATORS.items():
        if marker(name) in markdown:
            markdown = markdown.replace(marker(name), generate())
    return markdown


def on_page_markdown(markdown, page, config, files, **kwargs):
    return expand(markdown)
