"""Data sets from outside fedmpi: `data.name` an entry point of the group `fedmpi.datasets` or a path
`package.module:function` (fedmpi.core.plugin_names; the built-in sources of `sources.LOADERS` come first).

The function is called with the data section's keys as keyword arguments (`root`, `download`, `alpha`, ...,
and the entries of `data.kwargs`), only those its signature names unless it takes **kwargs, and returns a
mapping of numpy arrays that `checked_arrays.dataset_from_mapping` checks (x/y train and test, optional
natural client ids). It runs on the node's first rank (or on every rank where the data is not shared), so it
must return the same arrays wherever it runs: draw any randomness from its own fixed seed.
"""

from __future__ import annotations

import dataclasses

from fedmpi.core import plugin_names
from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError
from fedmpi.data.checked_arrays import dataset_from_mapping
from fedmpi.data.dataset import Dataset

GROUP = "fedmpi.datasets"
# DataConfig's keys for fedmpi's own sources, not passed to a plug-in (data.kwargs is spread instead).
NOT_PASSED = ("name", "kwargs", "columns")


def offered_keys(data) -> dict:
    """The keyword arguments a plug-in may take: the data section's keys, then `data.kwargs`' entries."""
    offered = {f.name: getattr(data, f.name) for f in dataclasses.fields(data) if f.name not in NOT_PASSED}
    clash = sorted(set(offered) & set(data.kwargs))
    if clash:
        raise ConfigError(f"data.kwargs.{clash[0]}: is a key of the data section itself; set data.{clash[0]} "
                          f"instead of putting it in data.kwargs")
    return {**offered, **data.kwargs}


def load_plugin(data) -> Dataset:
    """The Dataset of the plug-in `data.name`, checked."""
    name = data.name
    fn = plugin_names.resolve(name, GROUP, "data.name")
    if not callable(fn):
        raise ConfigError(f"data.name = {show(name)}: names a {type(fn).__name__}, not a function; a data set "
                          f"plug-in is a function returning a mapping of numpy arrays")
    where = f"data.name = {show(name)}"
    try:
        arrays = fn(**plugin_names.keyword_subset(fn, offered_keys(data)))
    except (KeyboardInterrupt, ConfigError):
        raise
    except SystemExit as e:
        raise ConfigError(f"{where}: the function called sys.exit({show(e.code)}); it must return its "
                          f"arrays") from None
    except Exception as e:  # noqa: BLE001 - whatever the plug-in raises is the plug-in's problem, reported as such
        first = (str(e).splitlines() or [""])[0][:300]
        raise ConfigError(f"{where}: the function raised {type(e).__name__}: {first}") from None
    return dataset_from_mapping(name, arrays, where)
