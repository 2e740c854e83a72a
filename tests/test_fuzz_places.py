"""Issue 39's path rule as a property over every subcommand that writes: whatever output path a user types
(empty, `.`, `..`, relative, absolute, through or at a symbolic link, the home folder, a repository's root,
an input of the command), nothing outside the requested output changes, a protected place is exit 2, and an
exit 2 changes nothing at all.

Each example runs in a fresh world of canary files: WORLD/home (HOME), WORLD/repo (a git repository's root)
with WORLD/repo/here (the current folder, holding the command's inputs) and WORLD/repo/sibling, and a link
here/lnk -> ../sibling. The command runs in this process through fedmpi.cli.main (tests/fuzz_support.cli)."""

from __future__ import annotations

import os
import shutil

import pytest
import yaml
from conftest import small_config
from fuzz_support import cli, examples, snapshot
from hypothesis import given
from hypothesis import strategies as st
from test_shakespeare_build import _lines, _play

from fedmpi.cli import main
from fedmpi.core.output_paths import protected_place

# Paths a user may type; "{home}", "{repo}" and "{world}" are the world's absolute folders.
TYPED = ["", " ", ".", "./", "..", "../..", "../sibling", "lnk", "lnk/", "lnk/x", "new", "new/deeper/x", "run",
         "c.yaml", "{home}", "{repo}", "{world}", "{world}/fresh/x", "{repo}/here", "{repo}/.git/x", "/"]
# What each subcommand writes, and how: (argv before the path, argv after it, flags it may take, kind).
COMMANDS = {
    "run": (["run", "c.yaml"], [], ["--overwrite"], "folder"),
    "data": (["data", "shakespeare", "--from", "{plays}", "--out"], [], ["--overwrite"], "folder"),
    "report-csv": (["report", "run", "--csv"], [], ["--force"], "file"),
    "report-plot": (["report", "run", "--plot"], [], ["--force"], "figure"),
    "export-csv": (["export", "run", "--csv"], [], ["--force"], "file"),
    "export-tb": (["export", "run", "--tensorboard"], [], ["--overwrite"], "folder"),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The world every example copies: inputs in here/ (a config, a finished run, plays) and canaries."""
    world = tmp_path_factory.mktemp("places") / "world"
    # matplotlib keeps its font cache under $HOME, which each example points into its world: a library's
    # cache, not an output of fedmpi, so it is kept outside the world.
    patch = pytest.MonkeyPatch()
    patch.setenv("MPLCONFIGDIR", str(world.parent / "mplconfig"))
    here = world / "repo" / "here"
    for folder in (world / "home", world / "repo" / ".git", world / "repo" / "sibling", here / "plays"):
        folder.mkdir(parents=True)
    for folder in (world, world / "home", world / "repo", world / "repo" / ".git", world / "repo" / "sibling", here):
        (folder / "canary.txt").write_text(f"canary of {folder.name}")
    (here / "lnk").symlink_to("../sibling")
    (here / "plays" / "one.md").write_text(_play("Play One", [("ANNE", _lines("Anne", 6)), ("BEN", _lines("Ben", 8))]),
                                           encoding="utf-8")
    cfg = small_config("run", rounds=1, data={"name": "synthetic"}, partition={"clients": 4, "scheme": "iid"},
                       server={"clients_per_round": 2}, checkpoint={"every": 0})
    (here / "c.yaml").write_text(yaml.safe_dump(cfg))
    cwd = os.getcwd()
    os.chdir(here)
    try:
        assert main(["run", "c.yaml"]) == 0
    finally:
        os.chdir(cwd)
    from fuzz_support import release_claims

    release_claims()
    yield world
    patch.undo()


def world_files(world):
    """Every file and link of the world by its real path: {path: sha256 or link target}."""
    return {os.path.realpath(os.path.join(world, rel)) if not os.path.islink(os.path.join(world, rel))
            else os.path.join(os.path.realpath(os.path.dirname(os.path.join(world, rel))), os.path.basename(rel)):
            digest for rel, digest in snapshot(world).items()}


def owned_by_output(requested, kind):
    """A predicate over real paths: inside the requested output (a folder's whole tree; a file, with the
    figures --plot writes beside it, PLOT-*.png, and the temporary file of its atomic write)."""
    real = os.path.realpath(requested)
    if kind == "folder":
        return lambda p: p == real or p.startswith(real.rstrip(os.sep) + os.sep)
    stem, ext = os.path.splitext(real)
    return lambda p: p == real or (kind == "figure" and p.startswith(stem + "-") and p.endswith(ext))


@pytest.fixture
def world(template, tmp_path, monkeypatch):
    return template, tmp_path, monkeypatch


def _one_world(template, root):
    world = root / f"w{len(os.listdir(root))}" / "world"
    shutil.copytree(template, world, symlinks=True)
    return world


@examples(40)
@given(command=st.sampled_from(sorted(COMMANDS)), typed=st.sampled_from(TYPED),
       suffix=st.sampled_from(["", ".png", ".csv"]), flag=st.booleans())
def test_no_command_touches_anything_outside_its_requested_output(world, command, typed, suffix, flag):
    template, root, monkeypatch = world
    world = _one_world(template, root)
    here = world / "repo" / "here"
    path = typed.format(home=world / "home", repo=world / "repo", world=world)
    path = path + suffix if path.strip() else path
    before, head, tail, flags, kind = world_files(world), *COMMANDS[command]
    argv = [a.format(plays=here / "plays") for a in head]
    argv += ([f"out={path}"] if command == "run" else [path]) + tail + (flags if flag else [])
    cwd = os.getcwd()
    monkeypatch.setenv("HOME", str(world / "home"))
    os.chdir(here)
    try:
        resolved = os.path.realpath(path) if path.strip() else ""
        outcome = cli(*argv)
    finally:
        os.chdir(cwd)
    what = f"fedmpi {' '.join(argv)} (in {here})"
    outcome.check((0, 2), what)
    after = world_files(world)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    if outcome.code == 2:
        assert not changed, f"{what}: exit 2 changed {sorted(changed)}"
    inside = owned_by_output(os.path.join(here, path), kind) if path.strip() else (lambda p: False)
    outside = sorted(p for p in changed if not inside(p))
    assert not outside, f"{what}: exit {outcome.code} changed files outside {resolved}: {outside}"
    with monkeypatch.context() as m:
        m.setenv("HOME", str(world / "home"))
        os.chdir(here)
        try:
            protected = (not path.strip() or (kind == "folder" and (protected_place(resolved)
                                                                    or os.path.islink(path.rstrip("/") or path))))
        finally:
            os.chdir(cwd)
    if protected:
        assert outcome.code == 2, f"{what}: a protected place ({resolved}) was accepted"
    assert "canary" in (world / "repo" / "here" / "canary.txt").read_text()
    shutil.rmtree(world.parent, ignore_errors=True)
