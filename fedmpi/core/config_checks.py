"""Range checks inside the config dataclasses' `__post_init__`: collect every problem of a section, then
raise them together (one line each, naming the dotted key, the bad value and what is allowed)."""

import difflib
import math
import reprlib
from dataclasses import MISSING, dataclass, fields

from fedmpi.core.errors import ConfigError

SHOWN_CHARS = 60     # an error echoes at most this much of a bad value


def show(value, limit=SHOWN_CHARS):
    """A short repr of `value` for an error message: at most `limit` characters, and built in time bounded
    by the limits (not by the value: a YAML alias bomb's repr would take minutes and gigabytes)."""
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 2, 3, 4, 4, 4
    r.maxstring = r.maxlong = r.maxother = limit
    try:
        text = r.repr(value)
    except ValueError:      # an integer beyond Python's 4,300-digit limit for int-to-text, maybe nested
        text = (f"<an integer of {value.bit_length()} bits>" if isinstance(value, int)
                else f"<a large {type(value).__name__}>")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Checks:
    """Collects range errors inside a section's __post_init__ and raises them all at once."""

    def __init__(self, section):
        self.section, self.errors = section, []

    def require(self, ok, key, value, allowed):
        if not ok:
            self.errors.append(f"{dotted(self.section, key)} = {show(value)}: {allowed}")

    def choice(self, key, value, allowed):
        """`value` must be one of `allowed` (a registry's names); suggests the closest on a typo."""
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            self.errors.append(f"{dotted(self.section, key)} = {show(value)}: unknown{hint}; must be one of "
                               f"{', '.join(allowed)}")

    def done(self):
        if self.errors:
            raise ConfigError(self.errors)


def dotted(section, key):
    return f"{section}.{key}" if section else key


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric key, declared beside it in its section's `RANGES` ({key: Range}) and
    checked for every section alike when a config is built (fedmpi.config.build), before the section's own
    checks see the value. Both ends are finite, so that the arithmetic the key enters stays finite and what
    it sizes stays within what `--dry-run` estimates; `why` says where the bound comes from."""

    low: float
    high: float
    why: str = ""
    low_open: bool = False      # (low, high]: e.g. a step size that must be > 0
    high_open: bool = False     # [low, high): e.g. a fraction that must stay below 1

    def holds(self, value):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        return ((self.low < value if self.low_open else self.low <= value)
                and (value < self.high if self.high_open else value <= self.high))

    def describe(self, integer=False, value=None):
        """What is valid; the reason for the upper end where `value` lies beyond it (or none is given)."""
        what = "an integer" if integer else "a number"
        ends = f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        beyond = value is None or not isinstance(value, (int, float)) or not value < self.low
        return f"must be {what} in {ends}" + (f" ({self.why})" if self.why and beyond else "")


def range_problems(cls, values, section):
    """The values of `values` ({key: value} of a `cls` section) outside the RANGES `cls` declares, as
    {key: message}; None (a nullable key left null) is not a number to check."""
    found = {}
    for key, rng in getattr(cls, "RANGES", {}).items():
        value = values.get(key)
        if value is not None and not rng.holds(value):
            integer = isinstance(value, int) and not isinstance(value, bool)
            found[key] = f"{dotted(section, key)} = {show(value)}: {rng.describe(integer, value)}"
    return found


def _defaults(section):
    return {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(section)}


def given(section, key, defaults=None):
    """Whether `key` of `section` (a config dataclass) is set to a value other than its default: what a user
    gave. A value equal to the default cannot count as given: a stored config (run.h5, checkpoints) lists
    every key, defaults included, and must read back."""
    return getattr(section, key) != (defaults or _defaults(section))[key]


def refuse_unused(c, section, form_key, uses, noun, form=None):
    """Refuses the keys of `section` (a config dataclass) that its chosen form does not read: `uses` maps each
    form (the value of `form_key`, or `form` where the form is derived from it, e.g. a file's kind from its
    suffix) to the keys it reads; a tuple of forms (several trackers) reads the union of theirs. A key only
    other forms read, set to a value other than its default, would change nothing without a word. A form
    `uses` does not declare refuses nothing. Called once the section's values passed their range checks, so
    a bad value is reported once."""
    value = getattr(section, form_key)
    form = value if form is None else form
    chosen = form if isinstance(form, tuple) else (form,)
    if not all(f in uses for f in chosen):
        return
    read = {k for f in chosen for k in uses[f]}
    defaults = _defaults(section)
    shown = show(list(value) if isinstance(value, tuple) else value) + ("" if form == value else f", {form}")
    for key in sorted({k for keys in uses.values() for k in keys} - read):
        users = [str(name) for name, keys in uses.items() if key in keys]
        c.require(not given(section, key, defaults), key, getattr(section, key),
                  f"is not used by {dotted(c.section, form_key)} {shown} (only by {', '.join(users)}); remove it "
                  f"or choose {'an' if noun[0] in 'aeiou' else 'a'} {noun} that uses it")


def refuse_overridden(c, section, overridden):
    """Refuses a key of `section` given beside the key that overrides it: `overridden` maps each key to the
    one whose value, when given, replaces it (attack.fraction beside attack.clients)."""
    defaults = _defaults(section)
    for key, by in overridden.items():
        c.require(not (given(section, key, defaults) and given(section, by, defaults)), key, getattr(section, key),
                  f"has no effect beside {dotted(c.section, by)}, which overrides it; remove one of them")


# Bounds many numeric keys share, each with its reason once.
MAX_FACTOR = 1e6    # a weight, step size or scale on float32 parameters, gradients or updates
MAX_COUNT = 10 ** 6     # epochs, steps or rounds of one phase


def factor(low=0.0, low_open=False):
    """The Range of a weight, step size or scale: finite, and at most MAX_FACTOR, beyond which its product
    with a float32 parameter or gradient of 3e32 overflows (3.4e38); any run diverges long before."""
    return Range(low, MAX_FACTOR, f"at most {MAX_FACTOR:g}: any run diverges long before", low_open)


MAX_CLIENTS = 10 ** 8  # partition.clients: every rank holds per-client arrays (sizes, labels, states)


def clients_range():
    return Range(1, MAX_CLIENTS, f"at most {MAX_CLIENTS:g}: every rank holds per-client arrays")


def count(low=1, samples=False):
    """The Range of a count of epochs, steps or rounds: MAX_COUNT of them would run for days on the
    smallest model (`samples`: a count of samples, at most MAX_SAMPLES, beyond any data set fedmpi loads)."""
    if samples:
        return Range(low, MAX_SAMPLES, f"at most {MAX_SAMPLES:g} samples")
    return Range(low, MAX_COUNT, f"at most {MAX_COUNT:g}")


MAX_SAMPLES = 10 ** 10
