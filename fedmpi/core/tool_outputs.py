"""The default places of the outputs of the scripts in tools/ and bench/: the working folder, never the
checkout or the fedmpi package.

A script's output (a table, a figure, a report section, a folder of runs) goes where its option names it; left
out, it goes into the folder the script was started from. Started from inside the checkout (its root, docs/,
runs/, ...) or the package, a left-out output is refused with one line naming the option (exit 2): the
checkout holds published files (docs/results/reproduction_*.csv and the like) that a default must never replace, and
regenerating them names them (`--docs docs/results`, `--csv docs/results/FILE.csv`). Every default is an absolute
path, so
that a run launched with the checkout as its working folder (as the tools launch tools/run_batch.py) still
writes where the user was."""

from __future__ import annotations

import argparse
import os
import sys

from fedmpi.core.errors import EXIT_USAGE, FedmpiError

# The fedmpi package (fedmpi/core/tool_outputs.py): defaults never point into it, wherever it is installed.
PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def is_within(path, folder):
    """Whether `path` is `folder` or lies under it, links resolved."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


_is_within = is_within


class ToolUsageError(FedmpiError):
    """A script's bad option or input: one line, exit 2."""

    exit_code = EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors raise ToolUsageError (one line and exit 2 from the script's main), not argparse's
    usage block."""

    def error(self, message):
        raise ToolUsageError(message)


def protected_folder(root, cwd=None):
    """The checkout `root` or the package when the working folder `cwd` (default: the current one) is inside
    it, else None."""
    cwd = os.getcwd() if cwd is None else cwd
    for folder in (root, PACKAGE):
        if folder and _is_within(cwd, folder):
            return os.path.realpath(folder)
    return None


def place(script, root, *outputs):
    """Absolute paths of a script's outputs, each (given, name, option[, example]): `given` (relative to the
    working folder) where the user named it, else `name` (a file or folder, may hold /) in the working folder.
    A left-out output while the working folder is inside the checkout `root` or the package: SystemExit(2)
    after one line naming every such option (with `example`, default `name`, as its value), so that nothing
    there is written unasked. Called before any work, so that a refusal costs nothing."""
    outputs = [(*o, None)[:4] for o in outputs]         # (given, name, option, example)
    inside = protected_folder(root)
    missing = [(option, example or name) for given, name, option, example in outputs if not given]
    if inside is not None and missing:
        options = " and ".join(option for option, _ in missing)
        examples = " ".join(f"{option} {value}" for option, value in missing)
        print(f"{script}: the working folder {os.getcwd()} is inside {inside}, where a script writes nothing "
              f"unasked; name the output{'s' if len(missing) > 1 else ''} with {options} (e.g. {examples}) or "
              f"start it from another folder", file=sys.stderr)
        raise SystemExit(2)
    return [os.path.abspath(given if given else name) for given, name, *_ in outputs]


def output_or_default(given, script, name, option, root, example=None):
    """`place` of one output."""
    return place(script, root, (given, name, option, example))[0]
