"""Issue 39, findings 1 and the path part of 2: every subcommand's output place decided by one rule
(fedmpi.core.output_paths): no empty path, no current folder or parent, home folder, repository root or
link; an existing file replaced only with --force, a non-empty folder only where the command wrote it and
--overwrite was given; missing parents made as `mkdir -p` would; every check before the first write."""

from __future__ import annotations

import glob
import os

import pytest
import yaml
from conftest import small_config
from run_files import write_run
from test_shakespeare_build import _lines, _play

from fedmpi.cli import main


def listing(folder):
    """{relative path: bytes} of every file under `folder`."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = open(path, "rb").read()
    return found


@pytest.fixture
def plays(tmp_path):
    folder = tmp_path / "plays"
    folder.mkdir()
    (folder / "one.md").write_text(_play("Play One", [("ANNE", _lines("Anne", 6)), ("BEN", _lines("Ben", 8))]),
                                   encoding="utf-8")
    return folder


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A current folder holding the user's files, inside a git repository, with a sibling folder."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "sibling").mkdir()
    (repo / "sibling" / "keep.txt").write_text("sibling")
    here = repo / "here"
    here.mkdir()
    (here / "notes.txt").write_text("precious")
    monkeypatch.chdir(here)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return here


def data(plays, out, *flags):
    return main(["data", "shakespeare", "--from", str(plays), "--out", str(out), *flags])


def test_an_empty_or_protected_out_never_replaces_the_current_folder(plays, here, tmp_path, capsys):
    before = listing(tmp_path)
    protected = ["", " ", ".", "./", "..", str(here), str(here.parent), str(tmp_path / "home"), "/",
                 str(here.parent / ".git" / "x")]
    for out in protected:
        for flags in ((), ("--overwrite",)):
            assert data(plays, out, *flags) == 2, out
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("fedmpi: error: --out"), (out, err)
    assert listing(tmp_path) == before      # `--out ''` once swapped the current folder aside and removed it


def test_overwrite_replaces_only_a_build_of_its_own_and_never_a_foreign_file(plays, here, capsys):
    (here / "foreign").mkdir()
    (here / "foreign" / "mine.txt").write_text("mine")
    assert data(plays, "foreign", "--overwrite") == 2
    assert "did not write" in capsys.readouterr().err and listing(here / "foreign") == {"mine.txt": b"mine"}
    os.symlink("foreign", "link")
    assert data(plays, "link", "--overwrite") == 2 and "symbolic link" in capsys.readouterr().err
    assert data(plays, "nested/deeper/shakespeare") == 0     # parents made as mkdir -p would
    built = sorted(listing(here / "nested" / "deeper" / "shakespeare"))
    assert [f for f in built if not f.startswith("binary/")] == [
        "build.json", "test/shakespeare_test.json", "train/shakespeare_train.json"]
    # and the arrays it indexes (docs/how-to/shakespeare.md, "The binary form")
    assert "binary/index.json" in built


def test_bad_data_arguments_are_one_line_and_exit_2(plays, here, capsys):
    for args in (["--out", "/proc/fedmpi-x"], ["--out", "/sys/fedmpi-x"], ["--out", "o", "--seed", "-1"],
                 ["--out", "notes.txt/o"]):
        assert main(["data", "shakespeare", "--from", str(plays), *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("--out" in err[0] or "--seed" in err[0]), err
    assert not os.path.exists("o")


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run" / "run.h5", rounds=4)


def test_report_keeps_an_existing_csv_or_figure_unless_forced(run, here, capsys):
    for option, name in (("--csv", "table.csv"), ("--plot", "curves.png")):
        (here / name).write_text("unrelated")
        assert main(["report", str(run), option, name]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "--force" in captured.err and (here / name).read_text() == "unrelated"
        assert main(["report", str(run), option, name, "--force"]) == 0
        assert (here / name).read_bytes() != b"unrelated"
        capsys.readouterr()
    assert main(["report", str(run), "--csv", "made/on/the/way.csv"]) == 0 and os.path.isfile("made/on/the/way.csv")


def test_report_plot_names_a_figure_format_and_an_empty_place_is_refused(run, here, capsys):
    for option, value in (("--plot", "x.h5"), ("--plot", "curves"), ("--plot", ""), ("--csv", "")):
        assert main(["report", str(run), option, value]) == 2, (option, value)
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
        assert "Traceback" not in captured.err and captured.err.startswith(f"fedmpi: error: {option}")
    assert sorted(os.listdir(here)) == ["notes.txt"]


def test_report_prints_the_readable_runs_beside_a_path_that_names_none(run, here, capsys):
    (here / "broken.h5").write_bytes(b"not hdf5")
    assert main(["report", str(run), "missing-run", "broken.h5"]) == 0
    captured = capsys.readouterr()
    assert "finished" in captured.out       # the good run's table row
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("fedmpi: warning: skipping") for w in warnings)
    assert main(["report", "missing-run"]) == 2


def test_export_removes_earlier_event_files_only_once_every_check_passed(run, here, capsys):
    pytest.importorskip("tensorboard")
    assert main(["export", str(run), "--tensorboard", "tb"]) == 0
    events = glob.glob("tb/events.out.tfevents.*")
    (here / "t.csv").write_text("unrelated")
    # --overwrite for the events, but the CSV exists without --force: refused before anything is removed
    assert main(["export", str(run), "--tensorboard", "tb", "--overwrite", "--csv", "t.csv"]) == 2
    assert glob.glob("tb/events.out.tfevents.*") == events and (here / "t.csv").read_text() == "unrelated"
    for place in ("", ".", "..", str(here.parent)):
        assert main(["export", str(run), "--tensorboard", place]) == 2, place
    capsys.readouterr()


def test_a_run_refuses_protected_and_linked_outs_before_anything_is_loaded(here, tmp_path, capsys):
    cfg = here.parent / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config("unused", rounds=1, data={"name": "synthetic"})))
    os.symlink(here.parent / "sibling", "link")
    before = listing(tmp_path)
    for out in (".", "..", str(here), str(here.parent), str(tmp_path / "home"), "link", "/"):
        for mode in ((), ("--dry-run",)):
            assert main(["run", str(cfg), f"out={out}", *mode]) == 2, (out, mode)
            err = capsys.readouterr().err.strip().splitlines()
            assert err and err[-1].startswith("fedmpi: ") and "out = " in err[-1], (out, err)
    assert listing(tmp_path) == before


def test_a_refused_run_leaves_no_folder_or_lock_of_its_own(here, tmp_path, capsys):
    cfg = here.parent / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config("unused", rounds=1, data={"name": "arrays",
                                                                          "root": str(tmp_path / "none.npz")})))
    (here / "existing").mkdir()
    (here / "existing" / "x.txt").write_text("x")
    assert main(["run", str(cfg), "out=new/nested"]) == 2
    assert main(["run", str(cfg), "out=existing"]) == 2
    assert not os.path.exists("new") and sorted(os.listdir("existing")) == ["x.txt"]
    assert capsys.readouterr().err.count("data.root") == 2


def test_a_trackers_file_store_obeys_the_place_rule(here, tmp_path, capsys):
    cfg = here.parent / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config("unused", rounds=1, data={"name": "synthetic"})))
    before = listing(tmp_path)
    for uri in (here.as_uri(), str(here), here.parent.as_uri(), str(tmp_path / "home")):
        for mode in ((), ("--dry-run",)):
            code = main(["run", str(cfg), f"out={here / 'run'}", "runtime.trackers=[mlflow]",
                         f"runtime.tracking_uri={uri}", *mode])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and err and err[-1].startswith("fedmpi: ") and "runtime.tracking_uri =" in err[-1], \
                (uri, mode, err)
    assert listing(tmp_path) == before
