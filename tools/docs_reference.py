"""The configuration reference of the documentation site, generated from the code (docs/reference/config.md).

One source of truth: every key of every config section, with its type, default and declared range
(`RANGES`, fedmpi.core.config_checks.Range), and its meaning from the field's docstring (the string literal
under the field, which griffe and IDEs read too). The algorithm keys come from every registered algorithm's
`Keys`, and the keys each choice reads (data sets, schemes, aggregators, attacks, server optimizers,
trackers...) from the registries' own `USES` declarations, so that a new key or component appears here
without an edit. tools/docs_hooks.py puts the text into the page at build time; tests/test_docs_site.py
checks that every key has a docstring and appears.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import textwrap
import typing
from dataclasses import MISSING, dataclass

import yaml

TOP_LEVEL = "top level"     # the section name of the root's own keys (seed, rounds, out)


@dataclass(frozen=True)
class Key:
    dotted: str         # e.g. server.robust.beta, or algorithm.mu
    type: str
    default: str
    range: str          # "" where the section declares none
    doc: str


@functools.cache
def _own_docs(cls) -> dict:
    """{field: docstring} of the fields `cls` itself annotates (its source, not its bases')."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body
    found = {}
    for node, after in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = after.value.value if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                                        and isinstance(after.value.value, str)) else ""
            found[node.target.id] = inspect.cleandoc(doc)
    return found


def field_docs(cls) -> dict:
    """{field: docstring} of a dataclass's fields; a field redeclared without one (e.g. an algorithm's `name`
    default) keeps its base's."""
    docs = {}
    for klass in reversed(cls.__mro__):
        for name, doc in _own_docs(klass).items():
            if doc or name not in docs:
                docs[name] = doc
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def _type_text(tp) -> str:
    from fedmpi.config.build import _type_name  # the wording the config's own error messages use

    return _type_name(tp)


def _default(f) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return ""
    if isinstance(value, tuple):
        value = [list(v) if isinstance(v, tuple) else v for v in value]
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def keys_of(cls, prefix) -> tuple[list, list]:
    """([Key] of `cls`'s leaf fields, [(prefix, class)] of its nested sections), keys named `prefix`.KEY."""
    hints = typing.get_type_hints(cls)
    docs, ranges = field_docs(cls), getattr(cls, "RANGES", {})
    leaves, nested = [], []
    for f in dataclasses.fields(cls):
        dotted, tp = f"{prefix}.{f.name}" if prefix else f.name, hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested.append((dotted, tp))
            continue
        if tp is typing.Any:        # Config.algorithm: its class depends on algorithm.name
            continue
        rng = ranges.get(f.name)
        text = rng.describe(integer=int in (tp, *typing.get_args(tp))).removeprefix("must be ") if rng else ""
        leaves.append(Key(dotted, _type_text(tp), _default(f), text, docs[f.name]))
    return leaves, nested


def sections() -> list:
    """[(section name, class, [Key])] of the whole config but the algorithm's, in the order of `Config`,
    nested sections (server.robust, client.lr_schedule...) after their parent."""
    from fedmpi.config import Config

    found, todo = [], [("", Config)]
    while todo:
        prefix, cls = todo.pop(0)
        leaves, nested = keys_of(cls, prefix)
        found.append((prefix or TOP_LEVEL, cls, leaves))
        todo[0:0] = nested
    return found


def algorithms() -> list:
    """[(name, class, [Key])] of every registered algorithm, its `algorithm.` keys but `name`."""
    from fedmpi.algorithms.registry import REGISTRY

    return [(name, algo, [k for k in keys_of(algo.Keys, "algorithm")[0] if k.dotted != "algorithm.name"])
            for name, algo in sorted(REGISTRY.items())]


def all_keys() -> list:
    """Every Key of the config (every algorithm's keys included): what the tests check."""
    keys = [k for _, _, leaves in sections() for k in leaves]
    return keys + [k for _, _, leaves in algorithms() for k in leaves]


# --- which keys each choice reads: the registries' own declarations -------------------------------------------

def _declared(module, attribute):
    return lambda: getattr(importlib.import_module(module), attribute)


def _server_optimizers():
    from fedmpi.round.server_opt import OPTIMIZERS

    return {name: cls.uses or () for name, cls in OPTIMIZERS.items()}


def _aggregators():
    from fedmpi.robust.keys import USES
    from fedmpi.robust.rules import RULES

    return {name: USES.get(name, rule.uses) for name, rule in RULES.items()}


# (the key that chooses, the section whose keys the choices read, {choice: keys read}): each registry's
# declaration, read when the page is built. A key another choice reads, set away from its default, is refused.
CHOICES = (
    ("data.name", "data", _declared("fedmpi.data.sources", "USES")),
    ("partition.scheme", "partition", _declared("fedmpi.data.partition", "USES")),
    ("server_data.scheme", "server_data", _declared("fedmpi.config.sections", "SERVER_SET_USES")),
    ("model.name", "model", _declared("fedmpi.config.sections", "MODEL_USES")),
    ("client.lr_schedule.name, server.lr_schedule.name", "lr_schedule", _declared("fedmpi.core.schedules", "USES")),
    ("client.compress.name", "client.compress", _declared("fedmpi.deploy.keys", "COMPRESS_USES")),
    ("clients.speed.kind", "clients.speed", _declared("fedmpi.deploy.keys", "SPEED_USES")),
    ("clients.bandwidth.kind", "clients.bandwidth", _declared("fedmpi.deploy.keys", "BANDWIDTH_USES")),
    ("server.optimizer", "server", _server_optimizers),
    ("server.aggregator", "server.robust", _aggregators),
    ("attack.name", "attack", _declared("fedmpi.attacks.keys", "USES")),
    ("secagg.noise", "secagg", _declared("fedmpi.secagg.keys", "NOISE_USES")),
    ("runtime.trackers", "runtime", _declared("fedmpi.config.run_sections", "TRACKER_USES")),
)


def _first_sentence(cls) -> str:
    """The first paragraph of the class's own docstring (not a base's, nor the signature dataclass writes)."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(cls.__name__ + "("):
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _pipeline():
    """The upload stages and participation providers fedmpi assembles a round from, in the order it asks them."""
    from fedmpi.round.providers import PROVIDERS, STAGES

    return STAGES, PROVIDERS


def _what(cls, module_too=False) -> str:
    """What the class is: its docstring's first paragraph, else (`module_too`) its module's (an algorithm's
    module names its paper), and its dotted name."""
    about = _first_sentence(cls)
    if not about and module_too:
        about = " ".join((inspect.getmodule(cls).__doc__ or "").split("\n\n")[0].split())
    where = f"`{cls.__module__}.{cls.__name__}`"
    return f"{_cell(about)} ({where})" if about else where


# --- the page ---------------------------------------------------------------------------------------------------

def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text) -> str:
    return f"`{text}`" if text != "" else ""


def _table(keys) -> list:
    """A table of keys, in a `key-table` block: docs/stylesheets/reference.css stacks its rows on a phone (the
    other tables of the page in `stack-table` blocks likewise, without the column labels)."""
    lines = ['<div class="key-table" markdown>', "", "| Key | Type | Default | Meaning |", "|---|---|---|---|"]
    for k in keys:
        meaning = _cell(k.doc) + (f" *Range: {_cell(k.range)}.*" if k.range else "")
        lines.append(f"| `{k.dotted}` | {_cell(k.type)} | {_code(_cell(k.default))} | {meaning} |")
    return lines + ["", "</div>"]


def config_markdown() -> str:
    """The generated part of docs/reference/config.md."""
    out = []
    for name, cls, leaves in sections():
        if not leaves:
            continue
        out += [f"## `{name}`" if name != TOP_LEVEL else "## Top-level keys", ""]
        intro = _first_sentence(cls) if name != TOP_LEVEL else ""
        out += ([intro, ""] if intro else []) + _table(leaves) + [""]
    out += ["## `algorithm`", "",
            "`algorithm.name` chooses the algorithm; the other `algorithm.` keys are those of its own `Keys` "
            "dataclass, listed here per registered algorithm.", ""]
    for name, algo, leaves in algorithms():
        out += [f"### `{name}`", "", _what(algo, module_too=True), ""]
        out += (_table(leaves) if leaves else ["No keys beyond `algorithm.name`."]) + [""]
    out += ["## Which keys each choice reads", "",
            "A key that only other choices read, set to a value other than its default, is refused with a config "
            "error: it would change nothing.", "", '<div class="stack-table" markdown>', "",
            "| Key | Choice | Keys it reads |", "|---|---|---|"]
    for key, section, declared in CHOICES:
        for choice, used in declared().items():
            read = ", ".join(f"`{section}.{u}`" for u in used) or "none"
            out.append(f"| `{key}` | `{choice}` | {read} |")
    out += ["", "</div>"]
    stages, providers = _pipeline()
    out += ["", "## Upload stages and participation providers", "",
            "fedmpi's own upload stages, in the order an update passes them (`order`), and its participation "
            "providers, in the order they are asked; each is switched on by the keys of the sections it reads.",
            "", '<div class="stack-table" markdown>', "", "| Kind | Name | Order | Sections read | What it is |",
            "|---|---|---|---|---|"]
    for cls in sorted(stages, key=lambda c: c.order):
        out.append(f"| stage | `{cls.name}` | {cls.order} | {', '.join(cls.reads)} | {_what(cls, module_too=True)} |")
    for cls in providers:
        out.append(f"| provider | `{cls.__name__}` | | {', '.join(cls.reads)} | {_what(cls, module_too=True)} |")
    return "\n".join(out + ["", "</div>"]) + "\n"
