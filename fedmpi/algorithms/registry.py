"""Which algorithm a config names: built-in ones (`@register`), installed plug-ins, or `module:Class`.

`algorithm.name` is looked up in this order:
1. the algorithms registered with `@register` (fedmpi's own, and any a user module registered on import);
2. entry points of the group `fedmpi.algorithms` (a package declares
   `[project.entry-points."fedmpi.algorithms"] myalgo = "mypkg.algo:MyAlgo"` and is pip-installed);
3. `package.module:Class`, imported as written (the module must be importable on every rank).
The class found must subclass `fedmpi.algorithms.base.Algorithm` and carry its keys dataclass as `Keys`.

Importing a plug-in runs its module's code, by design, as any Python import does. What can go wrong there
ends as a config error (exit 2) naming `algorithm.name` and the module: a malformed name (`:`, `..foo:Bar`,
`os:`), a module that is missing or raises at import, and one that calls sys.exit() while being imported
(which would otherwise end fedmpi with that status having done nothing). A KeyboardInterrupt is not an
import error and goes on up (Ctrl-C ends the run as everywhere else).
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points

from fedmpi.algorithms import (  # noqa: F401 - imported for their @register: fedmpi's own algorithms
    apfl,
    central,
    datashare,
    ditto,
    fedavg,
    fedbn,
    fedbuff,
    feddyn,
    fednova,
    fedper,
    fedprox,
    fedrep,
    fedskip,
    flora,
    fsl,
    hetlora,
    ifca,
    lgfedavg,
    local,
    lora_averaging,
    moon,
    perfedavg,
    pfedme,
    qffl,
    safl,
    scaffold,
)
from fedmpi.algorithms.catalog import REGISTRY, check_declarations, register  # noqa: F401 - register is public here
from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError
from fedmpi.core.plugin_names import guarded_import, import_attr

ENTRY_POINT_GROUP = "fedmpi.algorithms"
KEY, KIND = "algorithm.name", "algorithm class"     # what a failed import of a plug-in names


def builtin_names():
    return list(REGISTRY)


def lookup(name):
    """The algorithm class for `algorithm.name`; ConfigError naming what is available otherwise."""
    if not isinstance(name, str):       # e.g. `algorithm.name=os:` read by YAML as the mapping {os: null}
        raise ConfigError(f"algorithm.name = {show(name)}: must be a string: a built-in or installed "
                          f"algorithm's name, or 'package.module:Class' (quote it in an override)")
    if name in REGISTRY:
        return REGISTRY[name]
    plugins = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in plugins:
        return _checked(guarded_import(plugins[name].load, KEY, f"entry point {name!r} ({plugins[name].value})",
                                       plugins[name].value.partition(":")[0].strip(), KIND), name)
    if ":" in name:
        module, attr = _split_path(name)
        return _checked(guarded_import(lambda: import_attr(module, attr), KEY, name, module, KIND), name)
    known = list(REGISTRY) + sorted(plugins)
    close = difflib.get_close_matches(str(name)[:100], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(f"algorithm.name = {show(name)}: unknown{hint}; available: {', '.join(known)}, or "
                      f"'package.module:Class' for an algorithm outside fedmpi")


def _dotted(text):
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _split_path(name):
    """('package.module', 'Class') of a `package.module:Class` name; ConfigError for any other shape (an
    empty or relative module, an empty class, a second colon) before anything is imported."""
    module, _, attr = name.partition(":")
    if not (_dotted(module) and _dotted(attr)):
        raise ConfigError(f"algorithm.name = {show(name)}: not a valid plug-in name; write "
                          f"'package.module:Class' (an absolute module path and a class name, e.g. "
                          f"'mypkg.algo:MyAlgo'), or a built-in or installed algorithm's name")
    return module, attr


def _checked(cls, name):
    if not isinstance(cls, type):
        raise ConfigError(f"algorithm.name = {show(name)}: names a {type(cls).__name__}, not a class; "
                          f"'package.module:Class' must name a subclass of fedmpi.algorithms.base.Algorithm")
    try:
        check_declarations(cls)
    except TypeError as e:
        raise ConfigError(f"algorithm.name = {name!r}: {e}") from None
    return cls
