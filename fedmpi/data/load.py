"""`load_dataset`: from `data.name` to a checked Dataset, through the source registry `sources.LOADERS`.

Kept apart from dataset.py, which the sources import for `Dataset`: so no module imports one that
imports it back.
"""

from __future__ import annotations

from fedmpi.core import plugin_names
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.data import plugins, sources
from fedmpi.data.augment import make_transform
from fedmpi.data.dataset import Dataset, keep_first_classes
from fedmpi.mpi import signals


def load_dataset(cfg) -> Dataset:
    """Loads `cfg.data.name`; a missing or malformed file raises InputError naming it."""
    loader = sources.LOADERS.get(cfg.data.name)
    if loader is None and not plugin_names.known(cfg.data.name, plugins.GROUP):
        raise ConfigError(f"data.name = {cfg.data.name!r}: not available in this version; "
                          f"available: {', '.join(sources.LOADERS)}, or a plug-in 'package.module:function'")
    signals.test_pause("data")      # a test's Ctrl-C "while the data loads"
    if loader is None:              # a data set from outside fedmpi (checked as it is made)
        dataset = plugins.load_plugin(cfg.data)
    else:
        dataset = loader(cfg.data, cfg.seed, cfg.partition)
    return check_loaded(cfg.data, dataset)


def check_loaded(data, dataset) -> Dataset:
    """What every loaded data set goes through: the arrays' checks, `data.classes`, `data.augment`'s check
    (`data`: the data section)."""
    _check_arrays(dataset)
    if data.classes is not None:
        dataset = keep_first_classes(dataset, data.classes)
    _check_not_empty(data, dataset)
    make_transform(data, dataset.input_shape)    # data.augment on non-images fails here, on every rank
    return dataset


def _check_not_empty(data, ds):
    """An empty training or test set is refused: the run would record a test accuracy and loss of 0 every
    round (a figure that is not true), or train nothing."""
    where = f" (data.root = {data.root!r})" if data.root else ""
    classes = f" after data.classes = {data.classes}" if data.classes is not None else ""
    for part, y in (("training", ds.y_train), ("test", ds.y_test)):
        if len(y) == 0:
            raise InputError(f"data.name = {ds.name!r}{where}: the {part} set is empty{classes}; every run needs "
                             f"{part} samples (the global evaluation reads the test set)")


def _check_arrays(ds):
    """Catches files that parse but do not make a data set (label out of range, length mismatch)."""
    for part, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
        if len(x) != len(y):
            raise InputError(f"data.name = {ds.name!r}: {part} set has {len(x)} inputs but {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= ds.num_classes):
            raise InputError(f"data.name = {ds.name!r}: {part} labels must lie in 0..{ds.num_classes - 1}, "
                             f"found {y.min()}..{y.max()}")
