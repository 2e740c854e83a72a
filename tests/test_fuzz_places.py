"""Issue 39's path rule as a property over every subcommand that writes: whatever output path a user types
(empty, `.`, `..`, relative, absolute, through or at a symbolic link, the home folder, a repository's root,
an input of the command, a device node, a FIFO, a socket or a link to one, a name or path too long for the
file system), nothing outside the requested output changes, a protected place is exit 2, and an exit 2
changes nothing at all, not even an empty folder. Issue 50 (H01, H02, H08, H14): a node is refused, --force
or not, and stays that node; an overlong path leaves no folders behind; two outputs of one command never
name the same file.

Each example runs in a fresh world of canary files: WORLD/home (HOME), WORLD/repo (a git repository's root)
with WORLD/repo/here (the current folder, holding the command's inputs and the nodes node-KIND.png) and
WORLD/repo/sibling, and a link here/lnk -> ../sibling. The command runs in this process through
fedmpi.cli.main (tests/fuzz_support.cli); `sweep` writes its spec (here/sweep.yaml) with the path as `out`."""

from __future__ import annotations

import os
import shutil
import socket
import stat

import pytest
import yaml
from conftest import small_config
from fuzz_support import cli, examples, snapshot
from hypothesis import example, given
from hypothesis import strategies as st
from test_shakespeare_build import _lines, _play

from fedmpi.cli import main
from fedmpi.core.output_paths import protected_place

# Paths a user may type; "{home}", "{repo}" and "{world}" are the world's absolute folders.
TYPED = ["", " ", ".", "./", "..", "../..", "../sibling", "lnk", "lnk/", "lnk/x", "new", "new/deeper/x", "run",
         "c.yaml", "{home}", "{repo}", "{world}", "{world}/fresh/x", "{repo}/here", "{repo}/.git/x", "/",
         "node-fifo.png", "node-device.png", "node-socket.png", "node-device-link.png", "{long_name}",
         "{long_path}/x"]
NODES = ("fifo", "device", "socket", "device-link")
LONG_NAME, LONG_PATH = "n" * 300, "/".join(["d" * 200] * 25)   # over NAME_MAX (255); over PATH_MAX (4096)
# What each subcommand writes, and how: (argv before the path, argv after it, flags it may take, kind).
COMMANDS = {
    "run": (["run", "c.yaml"], [], ["--overwrite"], "folder"),
    "data": (["data", "shakespeare", "--from", "{plays}", "--out"], [], ["--overwrite"], "folder"),
    "report-csv": (["report", "run", "--csv"], [], ["--force"], "file"),
    "report-plot": (["report", "run", "--plot"], [], ["--force"], "figure"),
    "export-csv": (["export", "run", "--csv"], [], ["--force"], "file"),
    "export-tb": (["export", "run", "--tensorboard"], [], ["--overwrite"], "folder"),
    "sweep": (["sweep", "sweep.yaml"], [], [], "folder"),      # the path is the spec's `out`
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


def make_node(folder, kind):
    """here/node-KIND.png: a FIFO, a character device of our own (/dev/null's numbers: no system node is at
    risk), a socket, or a link to the device. None where this user may not make it (mknod needs root)."""
    path = os.path.join(folder, f"node-{kind}.png")
    device = os.path.join(folder, "node-device.png")
    try:
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":
            cwd = os.getcwd()
            os.chdir(folder)            # bound by a relative name: an AF_UNIX path holds at most 108 bytes
            try:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.bind(os.path.basename(path))
            finally:
                os.chdir(cwd)
        else:
            if not os.path.lexists(device):
                os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            if kind == "device-link":
                os.symlink(os.path.basename(device), path)
    except OSError:
        return None
    return path


def node_kinds(folder):
    """{name: the file type of what node-*.png points to} (a canary: a node must stay that node)."""
    return {name: stat.S_IFMT(os.stat(os.path.join(folder, name)).st_mode)
            for name in sorted(os.listdir(folder)) if name.startswith("node-")}


def world_folders(world):
    """Every folder under the world (an exit 2 makes none, not even an empty one: H02)."""
    return {os.path.relpath(root, world) for root, _, _ in os.walk(world)}


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
    for kind in NODES:      # made in each world: copytree would block reading a FIFO
        make_node(world / "repo" / "here", kind)
    return world


def write_spec(world, path):
    """here/sweep.yaml: one experiment of c.yaml into the sweep folder `path` (written before the world's
    snapshot: it is an input of the command)."""
    spec = {"base": "c.yaml", "out": path, "seeds": [0]}
    (world / "repo" / "here" / "sweep.yaml").write_text(yaml.safe_dump(spec))


def _command(world, command, path, flag):
    """The argv of `command` writing to `path` (with its flags where `flag`); the outcome, run in here/."""
    here = world / "repo" / "here"
    head, tail, flags, _ = COMMANDS[command]
    argv = [a.format(plays=here / "plays") for a in head]
    if command != "sweep":      # the sweep's spec (`write_spec`) names it
        argv += [f"out={path}"] if command == "run" else [path]
    argv += tail + (flags if flag else [])
    cwd = os.getcwd()
    os.chdir(here)
    try:
        return argv, cli(*argv)
    finally:
        os.chdir(cwd)


@examples(60)
@given(command=st.sampled_from(sorted(COMMANDS)), typed=st.sampled_from(TYPED),
       suffix=st.sampled_from(["", ".png", ".csv"]), flag=st.booleans())
@example(command="report-csv", typed="node-fifo.png", suffix="", flag=True)       # H01, whatever the draw
@example(command="export-csv", typed="node-device.png", suffix="", flag=True)
def test_no_command_touches_anything_outside_its_requested_output(world, command, typed, suffix, flag):
    template, root, monkeypatch = world
    world = _one_world(template, root)
    here = world / "repo" / "here"
    path = typed.format(home=world / "home", repo=world / "repo", world=world, long_name=LONG_NAME,
                        long_path=LONG_PATH)
    path = path + suffix if path.strip() and not typed.startswith("node-") else path
    write_spec(world, path)
    before, folders, nodes, kind = world_files(world), world_folders(world), node_kinds(here), COMMANDS[command][3]
    monkeypatch.setenv("HOME", str(world / "home"))
    cwd = os.getcwd()
    os.chdir(here)
    try:
        resolved = os.path.realpath(path) if path.strip() else ""
        special = os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path))
    finally:
        os.chdir(cwd)
    argv, outcome = _command(world, command, path, flag)
    what = f"fedmpi {' '.join(argv)} (in {here})"
    outcome.check((0, 2), what)
    assert node_kinds(here) == nodes, f"{what}: a device node, FIFO or socket was replaced"
    if special or typed in ("{long_name}", "{long_path}/x"):
        assert outcome.code == 2, f"{what}: a node or an overlong path was accepted"
    after = world_files(world)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    if outcome.code == 2:
        assert not changed, f"{what}: exit 2 changed {sorted(changed)}"
        assert world_folders(world) == folders, f"{what}: exit 2 left folders behind"
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


def _refused_in_one_line(outcome, what, option):
    outcome.check((2,), what)
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0], f"{what}: {lines}"


OPTION = {"run": "out =", "data": "--out", "report-csv": "--csv", "report-plot": "--plot", "export-csv": "--csv",
          "export-tb": "--tensorboard", "sweep": "out"}


@pytest.mark.parametrize("kind", NODES)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_output_replaces_a_device_fifo_or_socket_with_its_flags_or_not(world, command, kind):
    """H01: `fedmpi report RUN --csv /dev/full --force` replaced the node by a CSV (a FIFO too; report --plot,
    export --csv alike). Every command, every kind of node (a link to a device too), its --force/--overwrite
    given: exit 2 in one line naming the option, and the world (the node itself included) unchanged."""
    template, root, _ = world
    world = _one_world(template, root)
    here = world / "repo" / "here"
    path = f"node-{kind}.png"
    if not os.path.lexists(here / path):
        pytest.skip(f"this user may not make a {kind} (mknod needs root)")
    write_spec(world, path)
    before, nodes = world_files(world), node_kinds(here)
    argv, outcome = _command(world, command, path, flag=True)
    _refused_in_one_line(outcome, f"fedmpi {' '.join(argv)}", OPTION[command])
    assert node_kinds(here) == nodes and world_files(world) == before


@pytest.mark.parametrize("typed", ["{long_name}", "{long_name}/x.png", "{long_path}/x.png", "new/{long_name}.png"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_overlong_output_is_one_line_exit_2_and_makes_no_folder(world, command, typed):
    """H02, H08: a path the file system cannot hold (a name over NAME_MAX, a path over PATH_MAX) is refused
    before anything is made: one line naming the option (not an OSError traceback, exit 1, as `data
    shakespeare --out` gave), and none of the nested folders it could make stays behind."""
    template, root, _ = world
    world = _one_world(template, root)
    path = typed.format(long_name=LONG_NAME, long_path=LONG_PATH)
    write_spec(world, path)
    before, folders = world_files(world), world_folders(world)
    argv, outcome = _command(world, command, path, flag=True)
    _refused_in_one_line(outcome, f"fedmpi {' '.join(argv)[:200]}", OPTION[command])
    assert world_files(world) == before and world_folders(world) == folders


SAME_PATH = [   # (argv after `fedmpi`, a file that exists before, with its bytes kept)
    (["report", "run", "--csv", "x.png", "--plot", "x.png"], None),
    (["report", "run", "--csv", "./x.png", "--plot", "{here}/x.png", "--force"], "x.png"),
    (["report", "run", "--csv", "lnk/../here/x.png", "--plot", "x.png"], None),
    (["report", "run", "--csv", "x-run.png", "--plot", "x.png", "--per-run"], None),
    (["report", "run", "--csv", "t.png", "--classes", "--plot", "t-classes.png"], None),
    (["report", "run", "--csv", "x.png", "--plot", "y.png", "--per-run", "--timing", "--force"], "x.png"),
    (["export", "run", "--csv", "e", "--tensorboard", "e"], None),
    (["export", "run", "--csv", "sib.csv", "--tensorboard", "lnk/../here/sib.csv", "--force"], None),
]


@pytest.mark.parametrize(("argv", "kept"), SAME_PATH, ids=range(len(SAME_PATH)))
def test_two_outputs_of_one_command_never_name_the_same_file(world, argv, kept):
    """H14: `report RUN --csv x.png --plot x.png` wrote the CSV and then replaced it by the figure, exit 0.
    Two outputs naming one file (spelled alike or not, existing or not yet, a figure beside --plot
    included) are exit 2 before anything is written; an existing file there keeps its bytes."""
    template, root, _ = world
    world = _one_world(template, root)
    here = world / "repo" / "here"
    if kept:
        (here / kept).write_text("canary")
    argv = [a.format(here=here) for a in argv]
    before, folders = world_files(world), world_folders(world)
    cwd = os.getcwd()
    os.chdir(here)
    try:
        outcome = cli(*argv)
    finally:
        os.chdir(cwd)
    what = f"fedmpi {' '.join(argv)}"
    if argv[-2:] == ["--timing", "--force"]:       # x.png and y.png differ: the control case, it writes
        outcome.check((0,), what)
        return
    _refused_in_one_line(outcome, what, "also named by")
    assert world_files(world) == before and world_folders(world) == folders
