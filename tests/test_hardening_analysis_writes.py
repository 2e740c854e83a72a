"""Issue 39: a full disk while `fedmpi report` or `fedmpi export` writes (the places passed their checks: the
disk fills afterwards) ends with one line naming the file, exit 1, no traceback, and no partial file left."""

from __future__ import annotations

import os

import pytest
from run_files import write_run

from fedmpi.cli import main

OUTPUTS = [("report", "--csv", "t.csv"), ("report", "--plot", "p.png"), ("export", "--csv", "t.csv"),
           ("export", "--tensorboard", "tb")]


@pytest.mark.parametrize("command, option, name", OUTPUTS)
def test_a_full_disk_is_one_line_and_exit_1_leaving_no_partial_file(small_disk, tmp_path, capsys,
                                                                    command, option, name):
    if option == "--tensorboard":
        pytest.importorskip("tensorboard")
    run = write_run(tmp_path / "run" / "run.h5", rounds=40)
    disk = small_disk(256, 0)
    before = sorted(os.listdir(disk))
    assert main([command, str(run), option, str(disk / name)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedmpi: error: cannot write") and str(disk) in err[0], err
    assert "No space left on device" in err[0]
    made = sorted(set(os.listdir(disk)) - set(before))
    leftovers = [os.path.join(r, f) for r, _, files in os.walk(disk / name) for f in files] if made else []
    assert made in ([], [name]) and leftovers == [], (made, leftovers)
