"""Building a config section from a YAML mapping: each value read as its field's type (`coerce`), unknown keys
named with the closest known one, and every problem of a config collected, one line each, naming the dotted
key, the bad value and what is allowed. The algorithm's section takes its keys dataclass from the registry."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import fields
from typing import Literal

from fedmpi.core.config_checks import dotted as _dotted
from fedmpi.core.config_checks import range_problems
from fedmpi.core.config_checks import show as _show
from fedmpi.core.errors import ConfigError

# `Optional[X]` and `X | None` (what annotations under `from __future__ import annotations` evaluate to).
_UNIONS = (typing.Union, types.UnionType)

# Every integer key is used as a 64-bit integer at most (numpy arrays, HDF5 attributes: a seed of 2^64 was
# accepted, then failed at the first checkpoint); keys with tighter uses check their own range.
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1
# Strings may hold tab and newline (YAML allows them in a scalar); no other control character (a NUL in a
# path is cut off or refused by the OS, others garble the console) and no lone surrogate (not encodable
# as UTF-8, so not storable in run.h5).
# Unicode's control characters (category Cc: U+0000-001F, U+007F-009F) but tab and newline, and surrogates (Cs).
_BAD_CHARACTER = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def bad_character(text):
    """(position, character) of the first character a config string may not hold, or None."""
    m = _BAD_CHARACTER.search(text)
    return None if m is None else (m.start(), m.group())


def _type_name(tp):
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if origin in _UNIONS:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + " or null"
    if origin is tuple and typing.get_args(tp)[-1] is Ellipsis:
        return f"a list of values, each {_type_name(typing.get_args(tp)[0])}"
    if origin is tuple:
        return f"a list of {len(typing.get_args(tp))} values, each {_type_name(typing.get_args(tp)[0])}"
    names = {int: "an integer", float: "a number (not NaN or infinity)", bool: "true or false", str: "a string",
             tuple: "a list", dict: "a mapping of keys to values"}
    return names.get(tp, str(tp))


def _coerce(tp, value):
    """Returns (ok, value) for `value` read as type `tp`."""
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        if value is None:
            return True, None
        for inner in (a for a in typing.get_args(tp) if a is not type(None)):
            ok, coerced = _coerce(inner, value)
            if ok:
                return True, coerced
        return False, value
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin is tuple and len(typing.get_args(tp)) == 2 and typing.get_args(tp)[1] is Ellipsis:
        if not isinstance(value, (list, tuple)):     # tuple[T, ...]: a list of any length
            return False, value
        items = [_coerce(typing.get_args(tp)[0], v) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            return False, value
        items = [_coerce(a, v) for a, v in zip(args, value)]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return _int64(value), value
    if tp is float:
        # NaN and infinities are refused for every float key: a run with lr = inf only produces NaNs.
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False, value
        try:
            number = float(value)
        except OverflowError:       # an integer beyond float range
            return False, value
        return math.isfinite(number), number
    if tp is str:
        return isinstance(value, str) and bad_character(value) is None, value
    # A bare `tuple` or `dict` (partition.groups, attack.clients, data.kwargs) declares the form, a list or a
    # mapping, and leaves its items to the section's own checks: a scalar there reached them as a TypeError.
    if tp is tuple:
        return isinstance(value, (list, tuple)), value
    if tp is dict:
        return isinstance(value, dict), value
    return True, value


def _int64(value):
    return isinstance(value, int) and not isinstance(value, bool) and INT_MIN <= value <= INT_MAX


def _refusal(tp, value):
    """Why `value` is not a `tp`: the type expected, or what is wrong with a value of the right type."""
    if isinstance(value, str) and bad_character(value) is not None:
        i, ch = bad_character(value)
        return (f"holds the control character U+{ord(ch):04X} at position {i}; a string may hold tab and "
                f"newline but no other control character and no lone surrogate")
    if isinstance(value, int) and not isinstance(value, bool) and not _int64(value) and "integer" in _type_name(tp):
        return f"must be {_type_name(tp)}, within 64 bits (from -2^63 to 2^63 - 1)"
    return f"must be {_type_name(tp)}"


def _unknown(key, known):
    key = str(key)[:100]
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(sorted(known))}"
    return f"unknown key {_show(key)}{hint}"


def build_section(cls, mapping, prefix, errors):
    """An instance of `cls` from `mapping`, or None where its own checks failed; problems go to `errors`.

    A section with any problem is replaced by its defaults for the checks across sections (so that
    `__post_init__` never sees None), and the cross-section problems that name such a section are
    dropped: they would be judged on defaults the user never wrote."""
    if not isinstance(mapping, dict):
        errors.append(f"{prefix or 'config'} = {_show(mapping)}: must be a mapping of keys")
        return cls()
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    kwargs, failed = {}, []
    for key, value in mapping.items():
        dotted = _dotted(prefix, key)
        if key not in known:
            errors.append(_unknown(dotted, known))
            continue
        tp = hints[key]
        if (key == "algorithm" and not prefix) or dataclasses.is_dataclass(tp):
            algorithm = key == "algorithm" and not prefix
            if not algorithm and isinstance(value, str) and "name" in {f.name for f in fields(tp)}:
                value = {"name": value}     # a bare name, e.g. client.lr_schedule: cosine
            before = len(errors)
            section = _build_algorithm(value, errors) if algorithm else build_section(tp, value, dotted, errors)
            if section is None or len(errors) > before:
                failed.append(dotted)
                section = section if section is not None else tp()
            kwargs[key] = section
        else:
            ok, coerced = _coerce(tp, value)
            if ok:
                kwargs[key] = coerced
            else:
                errors.append(f"{dotted} = {_show(value)}: {_refusal(tp, value)}")
    # The declared ranges (a section's RANGES, fedmpi.core.config_checks.Range); a value outside its range is
    # left out, so the section's own checks see its default rather than a value it cannot compute with.
    for key, message in range_problems(cls, kwargs, prefix).items():
        errors.append(message)
        del kwargs[key]
    try:
        return cls(**kwargs)
    except ConfigError as e:
        errors.extend(_rooted(m, prefix) for m in e.messages if not any(_names_section(m, section)
                                                                        for section in failed))
        return None


def _names_section(message, section):
    """Whether `message` names a key of `section` (e.g. 'partition.clients' for 'partition')."""
    return re.search(rf"(?<![\w.]){re.escape(section)}\.", message) is not None


def _rooted(message, prefix):
    """A section reused at several places (ScheduleConfig) names its keys by its leaf name; root them."""
    leaf = prefix.rsplit(".", 1)[-1]
    if "." in prefix and message.startswith(leaf + ".") and not message.startswith(prefix + "."):
        return prefix + message[len(leaf):]
    return message


def algorithm_keys(name):
    from fedmpi.algorithms.registry import lookup

    return lookup(name).Keys


def _build_algorithm(mapping, errors):
    if not isinstance(mapping, dict):
        mapping = {"name": mapping}
    mapping = {"name": "fedavg", **mapping}
    try:
        keys = algorithm_keys(mapping["name"])
    except ConfigError as e:
        errors.extend(e.messages)
        return algorithm_keys("fedavg")()
    return build_section(keys, mapping, "algorithm", errors) or keys(name=mapping["name"])
