"""The benchmark's `--markdown FILE...`: the documents' marked blocks (bench/paired.py's `replace_marked`) checked
before anything runs and rewritten after, and the paired targets' block; bad input refused in one line with exit 2."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path


def _paired():
    key = "fedmpi_bench_paired"     # the same module object as bench.py's (bench.py loads it under this key)
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).resolve().parent / "paired.py")
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


def refuse(message):
    """Bad input: one line and exit 2, before anything runs or is written (as fedmpi's ConfigError)."""
    print(f"bench: {message}", file=sys.stderr)
    sys.exit(2)


def targets(paths, begin=None, end=None):
    """The documents whose block between the markers `begin` and `end` (the paired targets' by default) --markdown
    replaces, read and checked before anything runs: {path: text}."""
    paired = _paired()
    begin, end = begin or paired.BEGIN, end or paired.END
    docs = {}
    for path in paths or ():
        try:
            doc = Path(path).read_text()
            paired.replace_marked(doc, "", begin, end)
        except (OSError, ValueError) as e:
            refuse(f"--markdown {path}: {e}")
        docs[path] = doc
    return docs


def write(docs, block, begin=None, end=None):
    """Prints `block` and writes it between each document's markers (through a temporary file: a document is
    either rewritten whole or left as it was). Each document is read again here, not taken from `docs`: a long
    run's document may have been edited outside its block meanwhile, and those edits stay; one whose markers
    went missing meanwhile is left as it is, said on stderr."""
    paired = _paired()
    begin, end = begin or paired.BEGIN, end or paired.END
    print("\n" + block)
    for path in docs:
        try:
            text = paired.replace_marked(Path(path).read_text(), block, begin, end)
        except (OSError, ValueError) as e:
            print(f"bench: {path} not rewritten ({e}); the table is printed above", file=sys.stderr)
            continue
        tmp = Path(f"{path}.bench-tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        print(f"bench: table written into {path}")


def when():
    """'date, cores, load': where and when a block was measured."""
    return f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load " \
           f"{os.getloadavg()[0]:.1f} at the end"


def stamp(command):
    """'Measured with `command` (date, cores, load).': the opening of a block."""
    return f"Measured with `{command}` ({when()})."


def paired_block(rows, variation, command, pace="round"):
    """The paired targets' table with how it was measured."""
    paired = _paired()
    how = ("Each fedmpi run and a baseline run (the reference loop; for QS fedmpi at `-n 1`) were launched "
           "together and took turns a round at a time (bench/pacing.py); a pair's ratio is the median over "
           "rounds 2.. of round t's seconds over the baseline's round t" if pace == "round" else
           "Each fedmpi run is paired with a baseline run just before it (the reference loop; for QS fedmpi at "
           "`-n 1`); a pair's ratio is that of their medians of seconds per round (rounds 2..)")
    return "\n".join([
        stamp(command) + " " + how + "; the row's figure is the median of its pairs' ratios, min-max beside it. "
        "`ref x2` is the two-process floor: two reference processes side by side, each training the half of every "
        "round's clients that fedmpi deals a training rank, no communication, server or log. The host's variation "
        "(max - min of the baseline's own runs over their median): "
        + ", ".join(f"{wl} {100 * v:.1f}%" for wl, v in variation.items()) + ".", "",
        paired.markdown_table(paired.MARKDOWN_HEADER, paired.markdown_rows(rows))])
