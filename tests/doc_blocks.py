"""The fenced code blocks of README.md and the tutorials, read the way tests/test_docs_commands.py runs them.

The convention a writer of those pages follows:

- ```bash blocks are commands, run in the order of the page in one working folder, each block in a fresh
  `bash -e -o pipefail` (so a variable exported in one block is gone in the next); ```console blocks too,
  where only the lines starting with "$ " are commands and the rest is their output.
- ```python blocks run, in the same order and folder, with the test's Python.
- A block with a title, ```python title="my_fedavg.py"```, is a file: where the path exists in the repository
  the block must be that file, word for word (a spec shown in a page cannot drift from the one in jobs/);
  otherwise it is written there in the working folder before the blocks after it run.
- ```text blocks (and every other language: yaml, csv...) are shown, not run. A ```text block right after a
  command or Python block (or after another such ```text block) is that block's output: each of its lines
  but `...` must be a line of what the block printed, compared with every number as `#` and runs of blanks as
  one blank (the numbers of a real run vary from machine to machine, the words and columns must not).
- Lines that are not run: `make test` (the suite itself), and `sbatch` / `srun` (they need a cluster); an
  `sbatch` line is checked instead by `sbatch_request` (its options, its script, the config or spec it names).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\w*)(.*)$")
TITLE = re.compile(r'title="([^"]+)"')
RUN_LANGS = ("bash", "console", "python")
NOT_RUN = ("make test", "sbatch ", "srun ")


@dataclass
class Block:
    lang: str
    text: str
    line: int               # 1-based line of the opening fence
    title: str | None = None
    output: list = field(default_factory=list)     # the ```text blocks that show what this block prints

    @property
    def where(self):
        return f"line {self.line} ({self.lang}{' ' + self.title if self.title else ''})"


def blocks(path):
    """Every fenced block of the Markdown file `path`, in order; each ```text block that follows a block that
    runs (directly, or after other such ```text blocks) is attached to it as its output."""
    found, lines = [], Path(path).read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        title = TITLE.search(opening.group(2))
        found.append(Block(opening.group(1) or "text", "\n".join(lines[i + 1:end]) + "\n", i + 1,
                           title.group(1) if title else None))
        i = end + 1
    owner = None
    for block in found:
        if block.lang in RUN_LANGS and block.title is None:
            owner = block
        elif block.lang == "text" and owner is not None:
            owner.output.append(block)
        else:
            owner = None
    return found


def commands(block):
    """The logical lines of a ```bash or ```console block (`\\`-continued lines joined), comments and blank
    lines left out."""
    raw = block.text.splitlines()
    if block.lang == "console":
        raw = [line[2:] for line in raw if line.startswith("$ ")]
    joined, pending = [], ""
    for line in raw:
        line = line.lstrip() if pending else line
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [line.strip() for line in joined if line.strip() and not line.strip().startswith("#")]


def is_run(command):
    return not command.startswith(NOT_RUN)


def masked(line):
    """A line as an output check compares it: every number as #, runs of blanks and of dashes as one."""
    line = re.sub(r"\d+", "#", line)
    line = re.sub(r"-{2,}", "-", line)
    return re.sub(r"\s+", " ", line).strip()


def missing_output(shown, printed):
    """The lines of the shown output (a ```text block) that the printed output does not have."""
    have = {masked(line) for line in printed.splitlines()}
    return [line for line in shown.splitlines() if line.strip() not in ("", "...") and masked(line) not in have]


# --- sbatch lines ----------------------------------------------------------------------------------------------

POSITIVE = re.compile(r"^[1-9]\d*$")
SBATCH_OPTIONS = {           # the options the pages use, each with the form its value must have
    "ntasks": POSITIVE, "cpus-per-task": POSITIVE, "nodes": POSITIVE, "ntasks-per-node": POSITIVE,
    "gpus-per-node": re.compile(r"^(\w+:)?\d+$"),
    "array": re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*(%\d+)?$"),
    "time": re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$"),
    "partition": re.compile(r"^[\w.,-]+$"),
    "signal": re.compile(r"^(B:)?\w+(@\d+)?$"),
    "export": re.compile(r"^[\w,=:/.+-]+$"),
}


@dataclass(frozen=True)
class SbatchRequest:
    script: Path
    arguments: tuple
    options: dict            # the job's options: the script's #SBATCH defaults, replaced by the line's

    @property
    def cpus_per_node(self):
        nodes = int(self.options.get("nodes", 1))
        per_node = int(self.options["ntasks-per-node"]) if "ntasks-per-node" in self.options else \
            math.ceil(int(self.options.get("ntasks", 1)) / nodes)
        return per_node * int(self.options.get("cpus-per-task", 1))


def script_defaults(script):
    """The `#SBATCH --key=value` lines of a batch script."""
    found = {}
    for line in Path(script).read_text().splitlines():
        option = re.match(r"^#SBATCH --([\w-]+)(?:=(\S+))?", line)
        if option:
            found[option.group(1)] = option.group(2) or ""
    return found


def sbatch_request(command, root):
    """An `sbatch` line of a page, read as sbatch would: every option one of SBATCH_OPTIONS with a valid value,
    then an executable batch script of the repository and its arguments. Raises AssertionError naming what is
    wrong."""
    words = shlex.split(command, comments=True)
    assert words[0] == "sbatch", command
    options, i = {}, 1
    while i < len(words) and words[i].startswith("--"):
        name, _, value = words[i][2:].partition("=")
        assert name in SBATCH_OPTIONS, f"{command}: --{name} is not an option the pages' check knows"
        assert SBATCH_OPTIONS[name].match(value), f"{command}: --{name}={value!r} is not a valid value"
        options[name] = value
        i += 1
    assert i < len(words), f"{command}: no batch script"
    script = root / words[i]
    assert script.is_file() and script.stat().st_mode & 0o111, f"{command}: {words[i]} is not an executable script"
    job = script_defaults(script)
    if "ntasks-per-node" in options:
        job.pop("ntasks", None)
    return SbatchRequest(script, tuple(words[i + 1:]), {**job, **options})
