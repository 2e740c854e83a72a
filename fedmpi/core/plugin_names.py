"""Names of plug-ins from outside fedmpi (data sets, models), checked and loaded without torch.

A plug-in is named by an entry point of its group (`fedmpi.datasets`, `fedmpi.models`: a package declares
`[project.entry-points."fedmpi.models"] mynet = "mypkg.nets:MyNet"` and is pip-installed) or by a path
`package.module:attr` imported as written (the module must be importable on every rank). The config checks
only the name's shape (`well_formed`) or that the entry point is installed: nothing is imported until the data
set or the model is made, so reading a stored config needs neither the plug-in nor torch.

Importing a plug-in runs its module's code, as any Python import does. What goes wrong there ends as a
ConfigError (exit 2) naming the config key: a missing module, one that raises at import, and one that calls
sys.exit() while being imported (which would otherwise end fedmpi with that status having done nothing).
A KeyboardInterrupt is not an import error and goes on up. This mirrors fedmpi.algorithms.registry.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from fedmpi.core.config_checks import Range, show
from fedmpi.core.errors import ConfigError


def _dotted(text):
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def well_formed(name):
    """Whether `name` has the shape `package.module:attr` (absolute module, attribute path, one colon)."""
    if not isinstance(name, str) or name.count(":") != 1:
        return False
    module, _, attr = name.partition(":")
    return _dotted(module) and _dotted(attr)


def installed(group):
    """{name: entry point} of the installed plug-ins of `group`."""
    return {ep.name: ep for ep in entry_points(group=group)}


def known(name, group):
    """Whether a config may name `name` as a plug-in of `group`: an installed entry point or a well-formed path."""
    return isinstance(name, str) and (well_formed(name) or name in installed(group))


def resolve(name, group, key):
    """The object `name` stands for (entry point of `group` first, then `package.module:attr`); ConfigError
    naming `key` (e.g. 'model.name') for a malformed name or whatever its import raises."""
    plugins = installed(group)
    if name in plugins:
        ep = plugins[name]
        return guarded_import(ep.load, key, f"entry point {name!r} ({ep.value})", ep.value.partition(":")[0].strip())
    if not well_formed(name):
        raise ConfigError(f"{key} = {show(name)}: not a valid plug-in name; write 'package.module:attr' (an "
                          f"absolute module path and a name in it, e.g. 'mypkg.data:load'), or the name of an "
                          f"installed {group} entry point")
    module, _, attr = name.partition(":")
    return guarded_import(lambda: import_attr(module, attr), key, repr(name), module)


def import_attr(module, attr):
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# The plug-in modules loaded in this process: module name -> (config key, the name it was given as), so that an
# error raised inside one can be blamed on the key that named it (`blame`).
_LOADED = {}


def guarded_import(get, key, what, module, kind="function or class"):
    """`get()`, with whatever the import raises turned into a ConfigError naming `key`, `what` and the module
    (a KeyboardInterrupt excepted): the one guard of every plug-in (algorithms, data sets, models)."""
    where = f"module {module!r}"
    try:
        found = get()
        _LOADED[getattr(found, "__module__", None) or module] = (key, what)
        return found
    except ModuleNotFoundError as e:
        raise ConfigError(f"{key}: cannot load {what}: ModuleNotFoundError: {_not_found(e, module)}") from None
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{key}: cannot load {what}: {type(e).__name__}: {_first(e)}") from None
    except SystemExit as e:
        raise ConfigError(f"{key} = {what}: {where} called sys.exit({show(e.code)}) while being imported; a "
                          f"plug-in module must define its {kind}, not exit") from None
    except Exception as e:  # noqa: BLE001 - any error in a plug-in's own import code is the plug-in's
        raise ConfigError(f"{key} = {what}: importing {where} failed: {type(e).__name__}: {_first(e)}") from None


def _not_found(error, module):
    """What a ModuleNotFoundError means for a plug-in and what to do: the plug-in's own module (or a package
    above it) is not on the import path, or a module it imports is not installed."""
    missing = error.name or _first(error)
    if missing == module or module.startswith(f"{missing}."):
        return (f"no module {module!r} on the import path (sys.path); put the folder holding "
                f"{missing.partition('.')[0]!r} on PYTHONPATH (exported to every rank) or pip install its package")
    return (f"module {module!r} imports {missing!r}, which is not on the import path; pip install it (or put "
            f"its folder on PYTHONPATH)")


def blame(error):
    """`KEY = NAME: Class.method` of the plug-in the error was raised in (the outermost frame of its traceback
    whose code is a loaded plug-in's module, or whose `self`/`cls` is a plug-in's instance or class: a method
    the plug-in inherited), or None where no plug-in's code was on the way."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
        owner_cls = owner if isinstance(owner, type) else type(owner) if owner is not None else None
        for module in (getattr(owner_cls, "__module__", None), frame.f_globals.get("__name__")):
            if module in _LOADED:
                key, what = _LOADED[module]
                code = frame.f_code
                name = (f"{owner_cls.__name__}.{code.co_name}" if owner_cls is not None
                        else getattr(code, "co_qualname", code.co_name))
                return f"{key} = {what}: {name}"
        tb = tb.tb_next
    return None


def blamed(error):
    """The error's one line with the plug-in it was raised in named first (`blame`); None without one."""
    culprit = blame(error)
    return f"{culprit} raised {type(error).__name__}: {_first(error)}" if culprit else None


def _first(error):
    return (str(error).splitlines() or [""])[0][:300]


def keyword_subset(fn, offered):
    """The entries of `offered` that `fn`'s signature takes: all of them where it has **kwargs, else those it
    names (an object whose signature cannot be read gets them all)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return dict(offered)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(offered)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in offered.items() if k in names}


def named_parameters(fn):
    """The parameter names `fn`'s signature names explicitly (not **kwargs); empty where it cannot be read."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def load_subclass(name, group, key, base):
    """The class `name` stands for (`resolve`), which must subclass `base`; ConfigError naming `key` otherwise."""
    cls = resolve(name, group, key)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{key} = {name!r}: {cls!r} is not a subclass of {base.__module__}.{base.__qualname__}")
    return cls


def key_problems(cls, keys, section):
    """The values of a plug-in's free-form keys (`section`: e.g. 'participation.keys') outside what the class
    declares: `RANGES` ({key: fedmpi.core.config_checks.Range}) and `INTEGERS` (keys that must be integers);
    one line each. Checked at set-up and by --dry-run, so that a value the plug-in cannot compute with (a
    divisor of 0) is refused naming its key instead of failing in round 1."""
    ranges, integers = getattr(cls, "RANGES", {}), getattr(cls, "INTEGERS", ())
    found = []
    for key, value in keys.items():
        integer = isinstance(value, int) and not isinstance(value, bool)
        rng = ranges.get(key)
        if key in integers and not integer:
            found.append(f"{section}.{key} = {show(value)}: "
                         + (rng.describe(True) if isinstance(rng, Range) else "must be an integer"))
        elif isinstance(rng, Range) and not rng.holds(value):
            found.append(f"{section}.{key} = {show(value)}: {rng.describe(key in integers, value)}")
    return found


def check_names(cls, attr, where, allowed=None, what="key names"):
    """A class's declaration `attr` must be a tuple of strings (each in `allowed`, where given)."""
    declared = getattr(cls, attr, ())
    if not (isinstance(declared, tuple) and all(isinstance(k, str) for k in declared)
            and (allowed is None or set(declared) <= set(allowed))):
        raise ConfigError(f"{where}: {cls.__name__}.{attr} must be a tuple of {what}; it is {declared!r}")
