"""Issue 50's output rule inside output folders and in the sweep (fedmpi.core.output_paths): a device node,
FIFO or socket where a command would put one of its own files (a run's run.h5 or lock, an export's event
file, a Shakespeare build's file, the sweep's index) is refused with exit 2, --overwrite or not, and stays;
the sweep refuses, before any experiment runs, an index or a run folder it could not write (H15); a write
whose folders cannot all be made leaves none behind (H02). The generated place test over every command's
own output path is tests/test_fuzz_places.py."""

from __future__ import annotations

import os
import stat

import pytest
import yaml
from fuzz_support import cli
from run_files import write_run
from test_shakespeare_build import _lines, _play

from fedmpi.core.errors import InputError
from fedmpi.core.output_paths import make_folders, replace_with

TINY = {"seed": 0, "rounds": 1, "out": "unused", "data": {"name": "synthetic"}, "partition": {"clients": 4},
        "model": {"name": "lr"}, "client": {"lr": 0.05, "batch_size": 10}, "server": {"clients_per_round": 2},
        "runtime": {"threads": 1, "progress": "off"}, "checkpoint": {"every": 0}}


def is_fifo(path):
    return stat.S_ISFIFO(os.lstat(path).st_mode)


def refused(outcome, *words):
    """Exit 2 in one line holding `words` (asserted); the line."""
    outcome.check((2,), " ".join(words))
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    return lines[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(TINY))
    return tmp_path


# --- nodes where a command writes a file of its own into its folder -------------------------------------------

@pytest.mark.parametrize("name", ["run.h5", ".fedmpi.lock"])
def test_a_run_never_replaces_a_fifo_in_its_out_folder(here, name):
    (here / "out").mkdir()
    os.mkfifo(here / "out" / name)
    for flags in ((), ("--overwrite",)):
        refused(cli("run", "base.yaml", "out=out", *flags), "out =", name, "FIFO")
        assert is_fifo(here / "out" / name) and sorted(os.listdir(here / "out")) == [name]


def test_a_run_refuses_a_ckpt_that_is_not_a_folder_or_holds_a_fifo(here):
    (here / "out").mkdir()
    (here / "out" / "ckpt").write_text("mine")
    refused(cli("run", "base.yaml", "out=out", "--overwrite"), "out =", "ckpt")
    assert (here / "out" / "ckpt").read_text() == "mine"
    (here / "out" / "ckpt").unlink()
    (here / "out" / "ckpt").mkdir()
    os.mkfifo(here / "out" / "ckpt" / "ckpt-1.h5")
    refused(cli("run", "base.yaml", "out=out", "--overwrite"), "out =", "ckpt-1.h5", "FIFO")
    assert is_fifo(here / "out" / "ckpt" / "ckpt-1.h5")


def test_a_name_just_under_the_limit_still_works(here):
    """The temporary names beside an output (`.NAME.XXXXXXXX.tmp`, a build's `.NAME.building-XXXXXXXX`) are
    cut short: an output named with 250 bytes (under NAME_MAX) is written, not refused or failed."""
    run = write_run(here / "run" / "run.h5", rounds=3)
    name = "q" * 250
    cli("export", str(run), "--csv", name).check((0,), "export --csv NAME")
    (here / "plays").mkdir()
    (here / "plays" / "one.md").write_text(_play("Play One", [("ANNE", _lines("Anne", 6)), ("BEN", _lines("Ben", 8))]),
                                           encoding="utf-8")
    built = "b" * 250
    cli("data", "shakespeare", "--from", "plays", "--out", built).check((0,), "data --out NAME")
    assert (here / name).is_file() and (here / built / "build.json").is_file()


def test_an_export_overwrite_never_removes_a_fifo_named_like_an_event_file(here):
    run = write_run(here / "run" / "run.h5", rounds=3)
    (here / "tb").mkdir()
    os.mkfifo(here / "tb" / "events.out.tfevents.1.host")
    refused(cli("export", str(run), "--tensorboard", "tb", "--overwrite"), "--tensorboard", "FIFO")
    assert is_fifo(here / "tb" / "events.out.tfevents.1.host")


def test_a_shakespeare_rebuild_never_replaces_a_fifo_among_its_files(here):
    (here / "plays").mkdir()
    (here / "plays" / "one.md").write_text(_play("Play One", [("ANNE", _lines("Anne", 6)), ("BEN", _lines("Ben", 8))]),
                                           encoding="utf-8")
    cli("data", "shakespeare", "--from", "plays", "--out", "built").check((0,), "the first build")
    train = here / "built" / "train" / "shakespeare_train.json"
    train.unlink()
    os.mkfifo(train)
    refused(cli("data", "shakespeare", "--from", "plays", "--out", "built", "--overwrite"), "--out", "FIFO")
    assert is_fifo(train)


# --- the sweep's check before its first experiment (H15) ----------------------------------------------------------

def sweep(here, seeds=(0, 1)):
    (here / "spec.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "out": "out", "seeds": list(seeds)}))
    return cli("sweep", "spec.yaml")


def runs_made(here):
    """The run files an experiment wrote (a planted FIFO is none)."""
    return sorted(str(p.relative_to(here)) for p in here.rglob("run.h5") if p.is_file())


def test_a_sweep_whose_index_is_a_folder_is_refused_in_one_line(here):
    """H15: OUT/index.csv a folder gave a 30-line IsADirectoryError traceback (after the check)."""
    (here / "out" / "index.csv").mkdir(parents=True)
    refused(sweep(here), "index.csv", "is a folder")
    assert runs_made(here) == [] and os.listdir(here / "out" / "index.csv") == []


def test_a_sweep_whose_index_is_a_fifo_is_refused_without_reading_it(here):
    (here / "out").mkdir()
    os.mkfifo(here / "out" / "index.csv")
    refused(sweep(here), "index.csv", "FIFO")       # bounded: cli's alarm ends a blocked read as a failure
    assert is_fifo(here / "out" / "index.csv") and runs_made(here) == []


@pytest.mark.parametrize("planted", ["a file", "a link", "a fifo run.h5"])
def test_a_sweep_refuses_a_run_folder_it_cannot_use_before_any_experiment_runs(here, planted):
    """H15: a run folder replaced by a file or a link was found only when its experiment started (exit 1
    after the others ran); docs/how-to/sweeps.md promises the check before the first experiment."""
    folder = here / "out" / "seed-1"
    folder.parent.mkdir()
    if planted == "a file":
        folder.write_text("mine")
    elif planted == "a link":
        (here / "elsewhere").mkdir()
        folder.symlink_to(here / "elsewhere")
    else:
        folder.mkdir()
        os.mkfifo(folder / "run.h5")
    refused(sweep(here), "experiment seed-1", "seed-1")
    assert runs_made(here) == [] and not (here / "out" / "index.csv").exists()
    assert planted != "a file" or folder.read_text() == "mine"


# --- folders made for a write that fails ------------------------------------------------------------------------

def test_folders_made_on_the_way_are_removed_where_the_last_cannot_be_made(tmp_path):
    """H02: `mkdir -p` part-way (here: the last name over NAME_MAX) left the folders above it behind."""
    with pytest.raises(OSError):
        make_folders(tmp_path / "a" / "b" / "c" / ("n" * 300))
    assert os.listdir(tmp_path) == []


def test_a_node_that_appears_after_the_checks_is_still_not_replaced(tmp_path):
    """The rename of an atomic write re-checks its target: a FIFO made between the checks and the write."""
    os.mkfifo(tmp_path / "late.csv")
    with pytest.raises(InputError, match="FIFO"):
        replace_with(str(tmp_path / "late.csv"), lambda fh: fh.write("a,b\n"))
    assert is_fifo(tmp_path / "late.csv") and os.listdir(tmp_path) == ["late.csv"]
