"""A tiny package outside fedmpi, written into a test's folder: a data set function and a model class (and
broken ones for the error tests), with a `*.dist-info` (METADATA + entry_points.txt) so that importlib.metadata
finds its entry points `fedmpi.datasets: blobs` and `fedmpi.models: twolayer` without pip. The folder goes on
PYTHONPATH (sys.path in-process)."""

from __future__ import annotations

import os
import textwrap

from conftest import ROOT

DATA = '''\
"""Gaussian blobs, 3 classes, one natural client per id (ids 5, 15, 25, ...: any integers will do), and a
third of each client's size again as its own test samples. A fixed seed: every rank gets the same arrays."""
import numpy as np


def blobs(root=None, n_clients=4, per_client=30, dim=8):
    g = np.random.default_rng(7)
    centers = g.normal(0, 3, (3, dim))

    def make(k):
        ids = np.repeat(np.arange(n_clients), k)
        y = (ids + g.integers(0, 2, len(ids))) % 3
        return centers[y] + g.normal(0, 1, (len(ids), dim)), y, ids * 10 + 5

    x_tr, y_tr, c_tr = make(per_client)
    x_te, y_te, c_te = make(per_client // 3)
    return {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te,
            "client_train": c_tr, "client_test": c_te}


def everything(**kwargs):
    """Returns what it was called with (as an error's text), to see which keys a plug-in is given."""
    raise RuntimeError(repr(sorted(kwargs)))


def raises():
    raise ValueError("no such folder, says the plug-in")


def quits():
    raise SystemExit(3)


NOT_A_FUNCTION = 42
'''

NETS = '''\
import math

import torch
from torch import nn


class TwoLayer(nn.Module):
    """Told the data's shape and class count through its signature."""

    def __init__(self, input_shape, num_classes, width=16):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
                                 nn.Linear(width, num_classes))

    def forward(self, x):
        return self.net(x)


def linear(num_classes, features=8):
    """A factory naming num_classes only; the input width comes from model.kwargs."""
    return nn.Linear(features, num_classes)


class Raising(nn.Module):
    def __init__(self):
        raise RuntimeError("out of ideas")


def not_a_module():
    return "a string"


class IntegerParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)

    def forward(self, x):
        return x


class MetaUnfriendly(nn.Module):
    """Reads a tensor's value while being built: cannot be built on torch's meta device (--dry-run's sizes)."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.lin = nn.Linear(int(torch.tensor(input_shape).prod().item()), num_classes)

    def forward(self, x):
        return self.lin(x)


class WrongWidth(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)          # the data has 8 features

    def forward(self, x):
        return self.lin(x)
'''

BROKEN_IMPORT = 'raise RuntimeError("broken at import")\n'
EXITS_AT_IMPORT = 'import sys\nsys.exit(4)\n'

DIST_INFO = "tiny_fedmpi_plugins-0.1.dist-info"


def write_plugin_package(site):
    """myfl/ and its dist-info under the folder `site`; returns `site`."""
    pkg = site / "myfl"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data.py").write_text(DATA)
    (pkg / "nets.py").write_text(NETS)
    (pkg / "broken.py").write_text(BROKEN_IMPORT)
    (pkg / "exits.py").write_text(EXITS_AT_IMPORT)
    info = site / DIST_INFO
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-fedmpi-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [fedmpi.datasets]
        blobs = myfl.data:blobs

        [fedmpi.models]
        twolayer = myfl.nets:TwoLayer
        """))
    return site


def pythonpath(site):
    """PYTHONPATH for a launch: the package's folder, the repository, what was there."""
    return os.pathsep.join([str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
