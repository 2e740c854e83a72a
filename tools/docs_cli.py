"""The command-line reference of the documentation site, generated from fedmpi's argument parsers
(fedmpi.cli; docs/reference/cli.md): every `fedmpi` subcommand, nested ones too, with its usage line, its
description and a table of its arguments and options with their help text, choices and defaults; then the
scripts in tools/ whose main() builds a parser (captured without running them). Put into the page at build
time by tools/docs_hooks.py; tests/test_docs_site.py checks that every subcommand and option appears."""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
PARSE_METHODS = ("parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args")


def fedmpi_parser() -> argparse.ArgumentParser:
    """fedmpi's parser as `fedmpi report --help` builds it (with the report's figure definitions)."""
    from fedmpi.cli import _parser

    return _parser(["report"])


class _Built(Exception):
    """Raised in place of parsing: carries the parser a tool's main() built."""

    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def _raise_built(parser, *args, **kwargs):
    raise _Built(parser)


def tool_parsers() -> list:
    """[(command line, parser)] of the scripts in tools/ whose main() builds an argparse parser first thing:
    main() is called with parsing replaced by a raise, so nothing of the tool runs."""
    found = []
    for path in sorted(TOOLS.glob("*.py")):
        if path.name.startswith("docs_") or "def main(" not in path.read_text():
            continue
        spec = importlib.util.spec_from_file_location(f"docs_cli_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        saved = {name: getattr(argparse.ArgumentParser, name) for name in PARSE_METHODS}
        for name in PARSE_METHODS:
            setattr(argparse.ArgumentParser, name, _raise_built)
        try:
            spec.loader.exec_module(module)
            module.main(*([[]] if inspect.signature(module.main).parameters else []))
        except _Built as built:
            built.parser.prog = f"python tools/{path.name}"
            found.append((built.parser.prog, built.parser))
        finally:
            for name, method in saved.items():
                setattr(argparse.ArgumentParser, name, method)
            sys.modules.pop(spec.name, None)
    return found


def commands(parser=None, prefix="fedmpi") -> list:
    """[(command line, parser)] of every subcommand, depth first, the commands that only group others left out."""
    parser = parser or fedmpi_parser()
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = commands(sub, f"{prefix} {name}")
                found += nested if nested else [(f"{prefix} {name}", sub)]
    return found


def arguments(parser) -> list:
    """The parser's own arguments and options (not --help, not the subcommand choice)."""
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _name(action) -> str:
    if action.option_strings:
        takes = action.nargs != 0
        metavar = action.metavar or (action.dest.upper() if takes else "")
        if isinstance(metavar, tuple):
            metavar = " ".join(metavar)
        return ", ".join(f"{o} {metavar}".strip() for o in action.option_strings)
    return action.metavar or action.dest


def _help(action) -> str:
    text = _plain((action.help or "").replace("%%", "%"))
    if action.choices and not isinstance(action.choices, dict):
        text += f" Choices: {', '.join(f'`{c}`' for c in action.choices)}."
    if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings:
        text += f" Default: `{action.default}`."
    return text.replace("|", "\\|")


def _command_markdown(line, parser) -> list:
    out = [f"## `{line}`", ""]
    if parser.description:
        out += [_plain(parser.description), ""]
    out += ["```text", _usage(parser), "```", "", "| Argument or option | What it does |", "|---|---|"]
    out += [f"| `{_name(action)}` | {_help(action)} |" for action in arguments(parser)] + [""]
    if parser.epilog:
        out += ["```text", parser.epilog.strip(), "```", ""]
    return out


def cli_markdown() -> str:
    """The generated part of docs/reference/cli.md: fedmpi's commands, then the tools/ scripts'."""
    out = [summary_markdown()]
    for line, parser in commands():
        out += _command_markdown(line, parser)
    tools = tool_parsers()
    if tools:
        out += ["## Scripts in tools/", "",
                "The repository's scripts (reproduction reports, cost measurements), run from a checkout with "
                "the development install; their options as their parsers declare them.", ""]
        for line, parser in tools:
            out += [f"#{heading}" if heading.startswith("## ") else heading
                    for heading in _command_markdown(line, parser)]
    return "\n".join(out)


def _plain(text) -> str:
    """Help text on one line, its brackets and angle brackets escaped: argparse's text is not Markdown, and
    `[--clients 50]` would read as a link reference."""
    return " ".join(text.split()).replace("[", "\\[").replace("]", "\\]").replace("<", "&lt;")


def _usage(parser, width=72) -> str:
    """The usage line as argparse wraps it at `width` columns (a phone shows about 45 of a code block's)."""
    formatter = parser.formatter_class(prog=parser.prog, width=width)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip("\n")


def summary_markdown() -> str:
    """One line per subcommand, with the help its parent parser gives it."""
    out = ["| Command | What it does |", "|---|---|"]

    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
                for name, sub in action.choices.items():
                    if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                        walk(sub, f"{prefix} {name}")
                    else:
                        out.append(f"| [`{prefix} {name}`](#{_anchor(prefix + ' ' + name)}) | {helps.get(name, '')} |")

    walk(fedmpi_parser(), "fedmpi")
    return "\n".join(out) + "\n"


def _anchor(line) -> str:
    """The anchor mkdocs' toc gives the heading `line` (in a code span)."""
    return line.replace(" ", "-").lower()
