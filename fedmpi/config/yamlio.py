"""The one YAML loader and dumper of fedmpi: config files, `key=value` overrides and the configs stored in
run.h5 and checkpoints all go through `load`.

Why not `yaml.safe_load`: it reads YAML 1.1, where `on`/`off`/`yes`/`no` are booleans (so the documented
`runtime.progress=off` became False) and `1e-3` is a string; it keeps the last of two equal keys without
a word; and it expands aliases without limit, so nine lines of nested aliases ("billion laughs") build a
structure that takes seconds and gigabytes to print in an error message.

This loader:
- reads the YAML 1.2 core schema: only true/false (any case variant YAML 1.2 allows) are booleans,
  null/~/empty is null, integers are decimal (or 0o/0x), and `1e-3`, `1.0e30`, `.inf`, `.nan` are floats;
  `on`, `off`, `yes`, `no`, dates and `010`-style octals are what they look like (strings, decimals);
- refuses a key that appears twice in one mapping, naming the key and both lines;
- refuses documents nested deeper than MAX_DEPTH levels, and documents whose aliases would expand to more
  than MAX_NODES nodes or refer to themselves, before anything is built from them (composition keeps
  aliases shared, so this check costs time proportional to the text, not to the expansion);
- refuses texts longer than MAX_TEXT characters, and integers of more than MAX_INT_DIGITS digits (Python's
  int-from-text limit is 4,300; no config key takes more than 19);
- refuses a value its explicit tag cannot build (`!!int abc`, `!!float x`, `!!timestamp bad`, `!!binary`
  that is not base64), naming the tag, the text and the line, where PyYAML raised ValueError & co.
Safe constructors only, as in `yaml.safe_load`: no tag can create a Python object of an arbitrary class.

Every refusal is a ConfigError naming the source (file, override or stored config) and the line.
`dump` writes YAML that this loader and YAML 1.1 readers both read back to the same values.
"""

from __future__ import annotations

import binascii
import re

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver, Resolver
from yaml.scanner import Scanner

from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError

MAX_DEPTH = 64          # a config is three levels deep; 64 leaves room and keeps far from Python's recursion limit
MAX_NODES = 10_000      # a full config has about 80 nodes
MAX_TEXT = 1 << 20      # characters; a config is a few kB
MAX_INT_DIGITS = 100    # an integer literal's digits; the largest a key takes (a 64-bit seed) has 19

BOOL = "tag:yaml.org,2002:bool"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
NULL = "tag:yaml.org,2002:null"
MERGE = "tag:yaml.org,2002:merge"


class CoreResolver(BaseResolver):
    """Implicit types of the YAML 1.2 core schema (plus `<<` merge keys, which configs may use)."""


# Order matters where patterns overlap: the first matching resolver wins, so integers come before floats.
for _tag, _pattern, _first in (
        (BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
        (NULL, r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
        (INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
        (FLOAT, r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                r"|\.(?:nan|NaN|NAN))$", "-+0123456789."),
        (MERGE, r"^(?:<<)$", "<")):
    CoreResolver.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


class CoreConstructor(SafeConstructor):
    """SafeConstructor with the core schema's integers and floats (YAML 1.1 reads `010` as octal 8)."""

    def construct_object(self, node, deep=False):
        """Every node through here, so that a tagged scalar PyYAML cannot read (`!!int abc` raised ValueError,
        `!!timestamp bad` AttributeError) is a refusal naming the tag, the text and the line."""
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, AttributeError, OverflowError, KeyError, binascii.Error) as e:
            # KeyError: `!!bool maybe` (PyYAML looks the text up in its table of boolean spellings).
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            text = f" {show(node.value)}" if isinstance(node, ScalarNode) else ""
            key = getattr(self, "_keys", {}).get(id(node))
            where = f"{key}: " if key else ""
            # ValueError's text says why (e.g. "could not convert string to float"); the others are PyYAML's
            # internals ('NoneType' object has no attribute 'groupdict') and say nothing to a user.
            reason = f" ({str(e).splitlines()[0][:120]})" if type(e) is ValueError and str(e) else ""
            raise _Refused(f"{where}{tag}{text} is not a valid {tag} value{reason}", node.start_mark) from None

    def construct_core_int(self, node):
        text = self.construct_scalar(node)
        digits = len(text.lstrip("+-"))
        if digits > MAX_INT_DIGITS:
            raise _Refused(f"an integer of {digits} digits; integers have at most {MAX_INT_DIGITS} (no key takes "
                           f"more than a 64-bit value)", node.start_mark)
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)

    def construct_core_float(self, node):
        text = self.construct_scalar(node).lower()
        if text.endswith(".inf"):
            return float("-inf") if text.startswith("-") else float("inf")
        if text == ".nan":
            return float("nan")
        return float(text)


CoreConstructor.add_constructor(INT, CoreConstructor.construct_core_int)
CoreConstructor.add_constructor(FLOAT, CoreConstructor.construct_core_float)


class _Refused(yaml.YAMLError):
    """A document this loader will not build (duplicate key, too deep, too many nodes)."""

    def __init__(self, problem, mark=None):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _LimitedComposer(Composer):
    """Composer that counts nesting depth and checks each mapping for duplicate keys as it is composed
    (before `<<` merges are flattened, so a merged key overridden on purpose is not a duplicate)."""

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        first_line = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == MERGE:
                continue
            key = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise _Refused(f"duplicate key {show(key_node.value)} at line {line} (first at line "
                               f"{first_line[key]}); each key may appear once")
            first_line[key] = line
        return node

    def compose_document(self):
        node = super().compose_document()
        _check_expansion(node)
        self._keys = _dotted_keys(node)
        return node


def _dotted_keys(root):
    """{id(value node): its dotted key} for the values of nested mappings, so that a refused value names its
    key (eval.divergence) as well as its line. Runs after _check_expansion: the walk is bounded by MAX_NODES."""
    found, stack = {}, [(root, "")]
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, MappingNode):
            for key_node, value in node.value:
                if isinstance(key_node, ScalarNode) and key_node.tag != MERGE:
                    dotted = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
                    found[id(value)] = dotted
                    stack.append((value, dotted))
    return found


def _check_expansion(root):
    """Refuses a document whose aliases expand to more than MAX_NODES nodes or refer to an enclosing node.

    Sizes are memoised per node, so a shared (aliased) node is measured once however often it is used."""
    sizes, open_nodes = {}, set()

    def size(node):
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _Refused("an alias refers to a node that contains it (recursive structure)", node.start_mark)
        open_nodes.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        if total > MAX_NODES:
            raise _Refused(f"aliases expand to more than {MAX_NODES} values (an alias bomb?)", node.start_mark)
        sizes[key] = total
        return total

    if root is not None:
        size(root)


class Loader(Reader, Scanner, Parser, _LimitedComposer, CoreConstructor, CoreResolver):
    def __init__(self, stream):
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _LimitedComposer.__init__(self)
        CoreConstructor.__init__(self)
        CoreResolver.__init__(self)
        self._depth = 0


def load(text, source):
    """The value of one YAML document `text`; ConfigError naming `source` (e.g. "config file 'a.yaml'")
    and the line on any problem."""
    if len(text) > MAX_TEXT:
        raise ConfigError(f"{source}: longer than {MAX_TEXT} characters; a config is a few kB of YAML")
    loader = None
    try:
        # The reader refuses control characters (other than tab and line breaks) already here.
        loader = Loader(text)
        return loader.get_single_data()
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise ConfigError(f"{source}: character U+{e.character:04X} at line {line} is not allowed in YAML (control "
                          f"characters other than tab and line breaks, and lone surrogates)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: {_describe(e)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _describe(error):
    """One line: the problem and where, without the multi-line snippet PyYAML adds."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    if isinstance(error, _Refused):
        return f"{problem}{where}"
    problem = problem if len(problem) <= 160 else problem[:157] + "..."
    return f"not valid YAML: {problem}{where}"


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string either schema would read as something else ('on', '1e3', '010')."""


_Dumper.yaml_implicit_resolvers = {
    first: Resolver.yaml_implicit_resolvers.get(first, []) + CoreResolver.yaml_implicit_resolvers.get(first, [])
    for first in set(Resolver.yaml_implicit_resolvers) | set(CoreResolver.yaml_implicit_resolvers)}


def dump(data):
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
