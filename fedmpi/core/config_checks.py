"""Range checks inside the config dataclasses' `__post_init__`: collect every problem of a section, then
raise them together (one line each, naming the dotted key, the bad value and what is allowed)."""

import difflib
import reprlib

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
