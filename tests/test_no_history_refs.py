"""Docs, comments and messages describe the system as it is; its history lives in the git log. No tracked file
outside tests/ of the kinds that carry prose (.py .md .sh .sbatch .yaml .yml .toml .cfg, Makefile) names an issue
by number ("issue 42", "issues 8 and 18", "Issue #30") or a stop ("stop 47"). Names in code are not prose: the
module bench/issue42.py, the markers `<!-- bench:issue30:begin -->`, an option like `--done-when-42` do not match
(no space or '#' between the word and the number, or no word at all)."""

import re
import subprocess

from conftest import ROOT

KINDS = (".py", ".md", ".sh", ".sbatch", ".yaml", ".yml", ".toml", ".cfg")
HISTORY = re.compile(r"\b[Ii]ssues?\s*#?\d+\b|\bstop\s+\d+\b")     # also across a line break
# An identifier such as `issue42` (a module, a marker) names a thing in the code, not an event.
IDENTIFIER = re.compile(r"issues?\d+")


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in out.decode().split("\0"):
        if not name or name.startswith("tests/"):
            continue
        if name.endswith(KINDS) or name.rsplit("/", 1)[-1] == "Makefile":
            path = ROOT / name
            if path.is_file():
                yield name, path


def history_refs():
    found = []
    for name, path in tracked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        lines = text.splitlines()
        for match in HISTORY.finditer(text):
            if not IDENTIFIER.fullmatch(match.group()):
                number = text.count("\n", 0, match.start()) + 1
                found.append(f"{name}:{number}: {match.group()!r}: {lines[number - 1].strip()[:120]}")
    return found


def test_no_issue_numbers_outside_tests():
    found = history_refs()
    assert not found, ("issue or stop numbers outside tests/ (say what is true now; history is the git log's):\n"
                       + "\n".join(found))


def test_the_rule_matches_what_it_should():
    assert HISTORY.search("bit-identical to fedmpi before issue 25")
    assert HISTORY.search("(issues 8 and 18)") and HISTORY.search("Issue #30's targets")
    assert HISTORY.search("see stop 47") and HISTORY.search("Since issue\n  18 it is split")
    for name in ("bench:issue30:begin", 'sibling("issue42")', "--done-when-42", "issue30_block"):
        assert all(IDENTIFIER.fullmatch(m.group()) for m in HISTORY.finditer(name)), name
