"""Issue 38, item 2: every recorded figure is right or absent. A run whose evaluation would read an empty
set is refused at set-up naming the key, instead of recording test accuracy 0 and loss 0 every round."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_config, write_config

from fedmpi.cli import main


def arrays_file(path, train, test, classes=None):
    g = np.random.default_rng(0)
    y_test = np.arange(test) % 2 if classes is None else np.full(test, classes)
    np.savez(path, x_train=g.random((train, 4)).astype(np.float32), y_train=np.arange(train) % 2,
             x_test=g.random((test, 4)).astype(np.float32), y_test=y_test, num_classes=np.array(3))
    return path


@pytest.mark.parametrize("train, test, extra, part", [(40, 0, {}, "test"), (0, 10, {}, "training"),
                                                      (40, 10, {"classes": 2}, "test")])
def test_an_empty_evaluation_or_training_set_is_refused_naming_the_key(tmp_path, capsys, train, test, extra, part):
    # the third case: every test label is 2, and data.classes = 2 keeps labels 0 and 1 only
    root = arrays_file(tmp_path / "d.npz", train, test, classes=2 if extra else None)
    cfg = small_config(tmp_path / "out", data={"name": "arrays", "root": str(root), **extra},
                       partition={"clients": 4, "scheme": "iid"}, server={"clients_per_round": 2})
    path = write_config(tmp_path / "c.yaml", cfg)
    for mode in (["--dry-run"], []):
        assert main(["run", str(path), *mode]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "data.root" in err[0] and f"the {part} set is empty" in err[0], err
    assert not (tmp_path / "out").exists()
