"""Helpers of tests/test_fuzz.py: the Hypothesis profiles, strategies for config values built from the config
dataclasses' own fields, and writers of hostile input files. The property's machinery (fedmpi's CLI called in
this process with a time and an address-space bound, snapshots of a folder's bytes) is tests/fuzz_harness.py,
its names re-exported here so that every fuzz test imports its helpers from one place."""

from __future__ import annotations

import dataclasses
import os
import string
import typing

from fuzz_harness import (  # noqa: F401 - the property's machinery, imported from here by the fuzz tests
    EXAMPLE_SECONDS,
    EXTRA_ADDRESS_SPACE,
    Hung,
    Outcome,
    bounded,
    cli,
    release_claims,
    run_status,
    snapshot,
)
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# --- profiles -----------------------------------------------------------------------------------------------

NIGHTLY = os.environ.get("FEDMPI_FUZZ") == "nightly"
SCALE = 20 if NIGHTLY else 1
_COMMON = dict(database=None, deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
# CI: the same examples on every run (derandomize), so a failure reproduces. Nightly: fresh random examples
# each time, 20x as many; a failure prints its reproduction blob.
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("nightly", derandomize=False, **_COMMON)
settings.load_profile("nightly" if NIGHTLY else "ci")


def examples(n):
    """`settings` for a test of `n` examples in CI (20 n under FEDMPI_FUZZ=nightly)."""
    return settings(max_examples=n * SCALE)


# --- config fields, from the dataclasses ---------------------------------------------------------------------

def leaf_fields(cls, prefix=""):
    """[(dotted key, type)] of every leaf field of a config dataclass, nested sections walked."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, dotted = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(tp):
            found += leaf_fields(tp, dotted + ".")
        elif tp is typing.Any and dotted == "algorithm":
            found += algorithm_fields()
        else:
            found.append((dotted, tp))
    return found


def algorithm_fields():
    """The keys of every registered algorithm's Keys dataclass (the `algorithm` field is typed Any: its
    section's class depends on algorithm.name)."""
    from fedmpi.algorithms.registry import REGISTRY

    merged = {}
    for algo in REGISTRY.values():
        for key, tp in leaf_fields(algo.Keys, "algorithm."):
            merged.setdefault(key, tp)
    return sorted(merged.items())


def config_fields():
    from fedmpi.config import Config

    return leaf_fields(Config)


def _names():
    """Keys whose strings are names from a registry: their valid values."""
    from fedmpi.algorithms.registry import REGISTRY
    from fedmpi.core.models import BUILDERS
    from fedmpi.core.schedules import SCHEDULES
    from fedmpi.data.partition import SCHEMES
    from fedmpi.data.sources import LOADERS
    from fedmpi.data.torchvision_sources import EMNIST_SPLITS
    from fedmpi.round.server_opt import OPTIMIZERS

    return {"data.name": tuple(LOADERS), "partition.scheme": tuple(SCHEMES), "model.name": tuple(BUILDERS),
            "server.optimizer": tuple(OPTIMIZERS), "client.lr_schedule.name": SCHEDULES,
            "server.lr_schedule.name": SCHEDULES, "algorithm.name": tuple(REGISTRY), "data.split": tuple(EMNIST_SPLITS)}


# --- YAML fragments: one value as YAML text, for `key: VALUE` in a file or `key=VALUE` on the command line ------

def quoted(text):
    """`text` as a YAML double-quoted scalar, every non-printable character (controls, NUL, lone surrogates)
    escaped, so the fragment stays one line of valid YAML whose value is exactly `text`."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7f:
            out.append(ch)
        elif code <= 0xff:
            out.append(f"\\x{code:02x}")
        elif code <= 0xffff:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


HOSTILE_SCALARS = (
    # booleans and nulls in every spelling (YAML 1.1's yes/no/on/off are strings in fedmpi's 1.2 reader)
    "yes", "no", "on", "off", "y", "n", "Yes", "OFF", "True", "FALSE", "true", "false", "null", "~", "", "Null",
    # numbers spelled every way
    "0", "-0", "+1", "010", "0o17", "0x1F", "0b101", "1_000", "1e308", "1e309", "-1e308", "-0.0", "4.9e-324",
    "1e-300", ".nan", ".NaN", ".inf", "-.inf", "+.inf", "nan", "inf", "-inf", "1.0e+30", "1.", ".5", "1e3", "1E3",
    "0.1.2", "1:30", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "18446744073709551616", "-9223372036854775809",
    # explicit tags, with good and bad content
    "!!int abc", "!!int 12", "!!int 0x1F", "!!int 1.5", "!!str 12", "!!str", "!!float x", "!!float 1",
    "!!bool maybe", "!!bool yes", "!!null x", "!!binary AAAA", "!!binary !!!", "!!binary", "!!timestamp 2001-12-14",
    "!!timestamp x", "!!set {a, b}", "!!omap [a: 1]", "!!pairs [a: 1]", "!!map [1]", "!!seq {a: 1}", "!custom x",
    "!!python/object:os.system x", "!!python/name:os.system", "!<tag:yaml.org,2002:int> 7", "!!merge x",
    # collections where scalars belong, anchors and aliases
    "[]", "{}", "[1, 2]", "[[1], [2]]", "{a: 1}", "{name: x}", "[null]", "[&a 1, *a]", "&a x", "*a", "[1, [2, [3]]]",
    "{<<: {a: 1}}", "{? [1] : 2}", "[.nan, .inf]", "[0.9, 0.99, 0.5]", "[0.9]",
    # YAML syntax that is not a value
    "[", "]", "{", "a: b", "- x", "'unterminated", '"unterminated', "| x", "> x", "%YAML 1.2", "---", "...",
    "@x", "`x", "#comment", "a # b", "\\", "'it''s'", '"\\x00"', '"\\ud800"', '"\\u0000\\u001b[31m"',
)


def _many_digits():
    return st.one_of(st.integers(20, 400), st.integers(401, 4300), st.just(4301)).map(lambda n: "9" * n)


def _text_values():
    return st.one_of(
        st.text(max_size=40).map(quoted),                                          # any code point, escaped
        st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20).map(quoted),
        st.text(string.ascii_letters + string.digits + "._-/", min_size=1, max_size=20),  # plain scalars
        st.integers(1000, 200_000).map(lambda n: quoted("a" * n)),                   # very long
        st.sampled_from("\x00\x01\x07\x08\x1b\x7f\x85\u2028\u2029\ufeff\ud800\udc80\udfff").map(
            lambda c: quoted(f"x{c}y")))


def hostile():
    """A YAML fragment of any kind: scalars of every spelling, tags, collections, broken syntax."""
    leaf = st.one_of(st.sampled_from(HOSTILE_SCALARS), _many_digits(), _text_values(),
                     st.floats().map(_float_text), st.integers(-(1 << 70), 1 << 70).map(str))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.dictionaries(st.sampled_from(["a", "name", "clients", "labels", "1"]), inner, max_size=2).map(
            lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}")), max_leaves=4)


def _float_text(x):
    if x != x:
        return ".nan"
    if x in (float("inf"), float("-inf")):
        return ".inf" if x > 0 else "-.inf"
    return repr(x)


def _literal_args(tp):
    args = typing.get_args(tp)
    return args[0] if len(args) == 1 and isinstance(args[0], tuple) else args     # Literal[TUPLE] too


def valid(tp, key="", sizes="small"):
    """A plausible YAML fragment for a field of type `tp` (`key` picks registry names). Integers are small,
    or (sizes="any") also far beyond any machine (>= 10^15): what lies between is a valid config of a large
    run, legitimately slow and large, so it is not drawn."""
    names = _names()
    origin = typing.get_origin(tp)
    if key in names:
        return st.sampled_from(names[key])
    if origin is typing.Literal:
        return st.sampled_from([str(a) if not isinstance(a, str) else quoted(a) for a in _literal_args(tp)])
    if origin in (typing.Union, __import__("types").UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return st.one_of(st.just("null"), *(valid(a, key, sizes) for a in inner))
    if origin is tuple and typing.get_args(tp)[-1] is Ellipsis:      # tuple[str, ...]: model.personal
        return st.lists(valid(typing.get_args(tp)[0], key, sizes), max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")
    if origin is tuple:
        args = typing.get_args(tp)
        return st.tuples(*(valid(a, key, sizes) for a in args)).map(lambda xs: "[" + ", ".join(xs) + "]")
    if tp is tuple:         # partition.groups
        group = st.tuples(st.integers(1, 3), st.lists(st.integers(0, 9), min_size=1, max_size=3))
        return st.lists(group, max_size=3).map(
            lambda gs: "[" + ", ".join(f"{{clients: {k}, labels: {ls}}}" for k, ls in gs) + "]")
    if tp is dict:          # data.kwargs, data.columns, model.kwargs: free mappings
        return st.sampled_from(["{}", "{x: x}"])
    if tp is bool:
        return st.sampled_from(["true", "false"])
    if tp is int:
        small = st.integers(0, 6).map(str)        # negatives come with the hostile values
        return small if sizes == "small" else st.one_of(small, st.integers(10 ** 15, 10 ** 40).map(str))
    if tp is float:
        return st.one_of(st.sampled_from(["0", "1", "0.5", "0.01", "1e-3", "0.999", "1.0"]),
                         st.floats(0, 1).map(_float_text))
    if tp is str:
        if key == "runtime.client_state_memory":
            return st.sampled_from(["4GB", "512MiB", "0", "1KB", "10 GB", "1e3"])
        return st.sampled_from(["x", "''", "runs/x", quoted("a b")])
    return st.just("null")


def value_for(key, tp, sizes="small"):
    """A fragment for one field: plausible for its type (3 in 4) or hostile of any kind."""
    good = valid(tp, key, sizes)
    if key in ("algorithm.name", "data.name", "model.name"):
        # A `module:Class` name is imported by design (any Python module's code runs): only fedmpi's own
        # and malformed ones, never a random module name that could happen to exist (data sets and models
        # from outside fedmpi are named so too).
        bad = st.one_of(st.sampled_from([":", "os:", "..foo:Bar", "a:b:c", "fedmpi.algorithms.fedavg:FedAvg",
                                         "fedmpi.algorithms.fedavg:Nope", "fedmpi:__version__", "[fedavg]"]),
                        hostile().filter(lambda f: ":" not in f))
    else:
        bad = hostile()
    return st.one_of(good, good, good, bad)


def algorithm_owners():
    """{algorithm.KEY: (names of the algorithms whose Keys have it)}."""
    from fedmpi.algorithms.registry import REGISTRY

    owners = {}
    for name, algo in REGISTRY.items():
        for key, _ in leaf_fields(algo.Keys, "algorithm."):
            owners.setdefault(key, []).append(name)
    return owners


@st.composite
def config_entries(draw, fields, sizes="small", max_keys=4):
    """{dotted key: YAML fragment} over a few of `fields`; an algorithm's own key usually comes with
    algorithm.name naming an algorithm that has it (else every such example is an unknown key)."""
    chosen = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=max_keys, unique_by=lambda kv: kv[0]))
    entries = draw(st.fixed_dictionaries({k: value_for(k, tp, sizes) for k, tp in chosen}))
    own = [k for k in entries if k.startswith("algorithm.") and k != "algorithm.name"]
    if own and "algorithm.name" not in entries and draw(st.integers(0, 4)):
        entries["algorithm.name"] = draw(st.sampled_from(algorithm_owners()[own[0]]))
    return entries


def yaml_text(base, entries):
    """A YAML file: the `base` mapping ({section: {key: fragment}} or {key: fragment}) with `entries` (dotted
    keys) merged in, written block style, each fragment as it is."""
    tree = {}
    for source in (flatten(base), entries):
        for dotted, fragment in source.items():
            node = tree
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    break
            else:
                node[leaf] = fragment
    return "".join(_block(tree, 0))


def _block(tree, depth):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield "  " * depth + f"{key}:\n"
            yield from _block(value, depth + 1)
        else:
            yield "  " * depth + f"{key}: {value}\n"


def flatten(mapping, prefix=""):
    out = {}
    for k, v in mapping.items():
        key = f"{prefix}.{k}" if prefix else k
        out.update(flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def mutated(text):
    """Byte-level damage to a file's text: truncation, a byte inserted or replaced, a BOM, invalid UTF-8."""
    data = text.encode("utf-8", "surrogatepass")
    return st.one_of(
        st.just(data),
        st.integers(0, len(data)).map(lambda i: data[:i]),
        st.tuples(st.integers(0, len(data)), st.binary(min_size=1, max_size=3)).map(
            lambda p: data[:p[0]] + p[1] + data[p[0]:]),
        st.tuples(st.integers(0, max(0, len(data) - 1)), st.integers(0, 255)).map(
            lambda p: data[:p[0]] + bytes([p[1]]) + data[p[0] + 1:]),
        st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"\x00", b"\xc3\x28", b"\t"]).map(lambda b: b + data))


# --- files that are not regular files -------------------------------------------------------------------------

# What a path may name besides a file: a FIFO (opening it waits for a writer, reading it for data that never
# comes) and character devices without an end. Every input file of the fuzz tests is also given each of these
# (tests/test_fuzz_inputs.py), by name, not by chance: a reader that does not refuse them hangs or fills memory.
SPECIAL_FILES = ("fifo", "dev-zero", "dev-urandom")


def make_special(path, kind):
    """Replaces `path` with a FIFO or a link to /dev/zero or /dev/urandom (`SPECIAL_FILES`)."""
    if os.path.lexists(path):
        os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/" + kind.removeprefix("dev-"), path)


# --- keys of the wrong form -------------------------------------------------------------------------------------

# YAML fragments of every form: each field is given those its declared type does not read (`wrong_form`).
FORMS = ("5", "-3", "1.5", "1e300", "true", "false", "x", "'5'", "''", "[]", "[1, 2]", "[x]", "[[1]]", "{}",
         "{a: 1}", "{name: x}", "[{clients: 1}]", "!!bool maybe", "!!int x", "!!float x")


def _reads(tp, value):
    """Whether a field declared `tp` takes a YAML value of `value`'s form, judged from the annotation alone
    (not by fedmpi's own coercion, which is what is under test): a bare `tuple` takes a list, `dict` a mapping."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, __import__("types").UnionType):
        return value is None or any(_reads(a, value) for a in args if a is not type(None))
    if origin is typing.Literal:
        return value in _literal_args(tp)
    if tp is tuple or origin is tuple:
        return isinstance(value, list)
    if tp is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return True


def wrong_forms(tp):
    """The FORMS of a form the declared type `tp` does not take, and those YAML cannot build at all (tags
    with bad content)."""
    # YAML 1.2, as configs are read: `1e300` is a number, not a string
    from fedmpi.config import yamlio

    return [f for f in FORMS if f.startswith("!!") or not _reads(tp, yamlio.load(f, "fragment"))]


def wrong_form_entry(key, tp):
    """{dotted key: fragment}: `key` given a fragment of a form its type `tp` does not take (an algorithm's own
    key under an algorithm that has it)."""
    owners = st.sampled_from(algorithm_owners()[key]) if key.startswith("algorithm.") and key != "algorithm.name" \
        else st.none()
    return st.tuples(st.sampled_from(wrong_forms(tp)), owners).map(
        lambda p: {key: p[0], **({"algorithm.name": p[1]} if p[1] else {})})
