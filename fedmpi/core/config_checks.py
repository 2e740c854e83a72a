"""Range checks inside the config dataclasses' `__post_init__`: collect every problem of a section, then
raise them together (one line each, naming the dotted key, the bad value and what is allowed)."""

import difflib
import reprlib
from dataclasses import MISSING, fields

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


def refuse_unused(c, section, form_key, uses, noun):
    """Refuses the keys of `section` (a config dataclass) that its chosen form does not read: `uses` maps each
    form (the value of `form_key`) to the keys it reads; a key only other forms read, set to a value other
    than its default, would change nothing without a word. A form `uses` does not declare refuses nothing.
    Called once the section's values passed their range checks, so a bad value is reported once."""
    form = getattr(section, form_key)
    if form not in uses:
        return
    defaults = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(section)}
    for key in sorted({k for keys in uses.values() for k in keys} - set(uses[form])):
        users = [name for name, keys in uses.items() if key in keys]
        c.require(getattr(section, key) == defaults[key], key, getattr(section, key),
                  f"is not used by {dotted(c.section, form_key)} {form!r} (only by {', '.join(users)}); remove it "
                  f"or choose a {noun} that uses it")
