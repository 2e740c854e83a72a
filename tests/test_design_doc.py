"""docs/explanation/design.md stays true to the code: every module, package or file it names exists (a dotted name's
attribute, such as `fedmpi.round.engine.run_round`, is defined or imported at its module's top level), and the
layers it draws are the layers contract that import-linter enforces (pyproject.toml). Both had drifted before
(issue 37); the import direction itself is lint-imports' to check, cycles tests/test_layers.py's."""

import ast
import re

import tomllib
from conftest import ROOT

DESIGN = ROOT / "docs" / "explanation" / "design.md"
DOTTED = re.compile(r"\bfedmpi(?:\.[A-Za-z_]\w*)+")
# A path in backticks ending in .py, or a repository path in the prose (tests/..., docs/..., fedmpi/...).
PATHS = re.compile(r"`([\w./-]+\.py)`|\b((?:fedmpi|tests|tools|bench|docs|jobs)/[\w./-]*\w\.(?:py|md|yaml))")


def top_level_names(path):
    """What a module defines or imports at its top level (without importing it: no torch needed)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def module_file(root, parts):
    """The file of module `parts` (a package's __init__.py), or None."""
    where = root.joinpath(*parts)
    for candidate in (where / "__init__.py", where.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def unresolved_names(text, root):
    """The dotted fedmpi names in `text` whose longest module prefix does not exist, or whose next part is not
    a top-level name of that module."""
    bad = []
    for name in sorted(set(DOTTED.findall(text))):
        parts = name.split(".")
        k = len(parts)
        while k and module_file(root, parts[:k]) is None:
            k -= 1
        found = module_file(root, parts[:k]) if k else None
        if found is None or (parts[k:] and parts[k] not in top_level_names(found)):
            bad.append(name)
    return bad


def missing_paths(text, root):
    """The paths in `text` that name no file: from the repository root, from fedmpi/ (`deploy/keys.py`), or, for
    a bare file name in backticks (`sections.py`), anywhere under fedmpi/."""
    bad = []
    for quoted, prose in PATHS.findall(text):
        name = quoted or prose
        places = [root / name, root / "fedmpi" / name]
        if "/" not in name:
            places += list((root / "fedmpi").rglob(name))
        if not any(p.is_file() for p in places):
            bad.append(name)
    return sorted(set(bad))


def drawn_layers(text):
    """The layers of design.md's section 4 drawing, top first, as import-linter writes them ('run | analysis')."""
    section = text.split("## 4. Layers", 1)[1].split("\n## ", 1)[0]
    drawing = section.split("```", 2)[1]
    layers = []
    for line in drawing.splitlines():
        names = re.match(r"(fedmpi\.\S+(?: \| fedmpi\.\S+)*)", line)
        if names:
            layers.append(" | ".join(n.removeprefix("fedmpi.") for n in names.group(1).split(" | ")))
    return layers


def test_the_checks_find_a_planted_drift(tmp_path):
    (tmp_path / "fedmpi" / "round").mkdir(parents=True)
    (tmp_path / "fedmpi" / "__init__.py").write_text("")
    (tmp_path / "fedmpi" / "round" / "__init__.py").write_text("")
    (tmp_path / "fedmpi" / "round" / "engine.py").write_text("from x import y as Outcome\ndef run_round():\n    pass\n")
    text = ("`fedmpi.round.engine.run_round`, fedmpi.round.engine.Outcome, `fedmpi.round.gone`, "
            "fedmpi.round.engine.nope, `round/engine.py`, `engine.py`, `fedmpi/round/moved.py`, tests/test_gone.py")
    assert unresolved_names(text, tmp_path) == ["fedmpi.round.engine.nope", "fedmpi.round.gone"]
    assert missing_paths(text, tmp_path) == ["fedmpi/round/moved.py", "tests/test_gone.py"]
    drawing = "## 4. Layers\n\n```\nfedmpi.cli    the CLI\nfedmpi.run | fedmpi.analysis   runs | reports\n```\n## 5."
    assert drawn_layers(drawing) == ["cli", "run | analysis"]


def test_every_module_and_file_design_md_names_exists():
    text = DESIGN.read_text()
    assert unresolved_names(text, ROOT) == []
    assert missing_paths(text, ROOT) == []


def test_design_md_draws_the_layers_import_linter_enforces():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    assert layers["containers"] == ["fedmpi"]
    assert drawn_layers(DESIGN.read_text()) == layers["layers"]
