"""Issue 39, the configuration keys: every key of the wrong YAML form, every number out of its declared range
and every key made moot by another is refused when the config is built (what `--dry-run` uses too), one line
naming the key; the omniscient attacks' impossible combinations at set-up, naming both keys. The cases are
generated from the config dataclasses, the algorithm registry and the components' declared reads."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from fuzz_support import cli, leaf_fields, quoted, snapshot

from fedmpi.algorithms.registry import REGISTRY
from fedmpi.attacks.keys import OMNISCIENT_ATTACKS, AttackConfig
from fedmpi.attacks.keys import USES as ATTACK_USES
from fedmpi.config import Config, from_dict, load
from fedmpi.config.build import _coerce
from fedmpi.config.run_sections import TRACKER_USES
from fedmpi.config.sections import MODEL_USES
from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError
from fedmpi.secagg.keys import NOISE_USES

BASE = {"seed": 1, "rounds": 1, "data": {"name": "synthetic"},
        "partition": {"clients": 4, "scheme": "iid", "samples_per_client": 20}, "model": {"name": "lr"},
        "client": {"batch_size": 10}, "server": {"clients_per_round": 2}, "runtime": {"threads": 1}}


def nested(entries):
    """{dotted key: value} as the nested mapping a YAML file gives, over BASE."""
    import copy

    out = copy.deepcopy(BASE)
    for dotted, value in entries.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def refusal(entries):
    """The messages of the ConfigError building BASE with `entries` raises (fails if none is raised)."""
    with pytest.raises(ConfigError) as e:
        from_dict(nested(entries))
    return e.value.messages


def _owner(key):
    return next(name for name, algo in REGISTRY.items() if key in {f.name for f in dataclasses.fields(algo.Keys)})


def _all_keys():
    """[(dotted key, type, extra entries)]: every leaf key of Config and of every algorithm's Keys."""
    found = [(k, tp, {}) for k, tp in leaf_fields(Config) if not k.startswith("algorithm")]
    seen = set()
    for name, algo in REGISTRY.items():
        for key, tp in leaf_fields(algo.Keys, "algorithm."):
            if key not in seen and key != "algorithm.name":
                seen.add(key)
                found.append((key, tp, {"algorithm.name": name}))
    return found


WRONG = (5, 1.5, True, "x", [1], {"a": 1})


def _wrong_forms(tp):
    """The values of WRONG the declared type `tp` does not read (a value of another YAML type)."""
    return [v for v in WRONG if not _coerce(tp, v)[0]]


@pytest.mark.parametrize("key, tp, extra", _all_keys(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_key_of_the_wrong_form_is_one_line_naming_it(key, tp, extra):
    wrong = _wrong_forms(tp)
    assert wrong, f"{key}: its type {tp} reads every value, so no form is checked"
    for value in wrong:
        messages = refusal({**extra, key: value})
        assert len(messages) == 1 and messages[0].startswith(f"{key} = "), (key, value, messages)


def test_attack_clients_of_the_wrong_form():
    """Issue 39's TypeError tracebacks: a scalar where the list of client ids belongs."""
    for value in (5, True):
        assert refusal({"attack.name": "gaussian", "attack.clients": value}) == [
            f"attack.clients = {value!r}: must be a list of values, each an integer"]


def test_a_tag_yaml_cannot_build_names_its_key(tmp_path):
    """`divergence: !!bool maybe` was a KeyError traceback (PyYAML's table of boolean spellings)."""
    path = tmp_path / "c.yaml"
    path.write_text("eval:\n  divergence: !!bool maybe\n")
    with pytest.raises(ConfigError) as e:
        load(path)
    assert len(e.value.messages) == 1 and "eval.divergence: !!bool 'maybe' is not a valid !!bool value (line 2" \
        in e.value.messages[0], e.value.messages


# --- declared ranges -------------------------------------------------------------------------------------------

def _numeric(tp):
    """Whether `tp` is a number or a nullable number (a list of numbers has its items checked by its section)."""
    if typing.get_origin(tp) is tuple:
        return False
    inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return any(a in (int, float) for a in inner)


def _ranged_sections():
    """(section name, class, extra entries): every algorithm's Keys and the attack section."""
    yield from ((f"algorithm ({name})", algo.Keys, {"algorithm.name": name}) for name, algo in REGISTRY.items())
    yield "attack", AttackConfig, {"attack.name": "backdoor"}


@pytest.mark.parametrize("where, cls, extra", list(_ranged_sections()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_numeric_key_declares_a_range_and_is_held_to_it(where, cls, extra):
    prefix = "algorithm." if cls is not AttackConfig else "attack."
    hints = typing.get_type_hints(cls)
    numeric = [f.name for f in dataclasses.fields(cls) if _numeric(hints[f.name])]
    ranges = getattr(cls, "RANGES", {})
    assert sorted(numeric) == sorted(ranges), f"{where}: numeric keys without a declared range"
    for key, rng in ranges.items():
        integer = int in typing.get_args(hints[key]) or hints[key] is int
        for outside in (rng.high * 10 + 1, rng.low - 1, 10 ** 15, -1e300, 1e300):
            if rng.holds(outside):
                continue
            value = int(outside) if integer and abs(outside) < 2 ** 62 else outside
            if integer and not isinstance(value, int):
                continue
            messages = refusal({**extra, prefix + key: value})
            assert len(messages) == 1 and messages[0].startswith(f"{prefix}{key} = "), (key, value, messages)


@pytest.mark.parametrize("entries, key", [
    ({"algorithm.name": "ifca", "algorithm.k": 10 ** 15}, "algorithm.k"),       # a MemoryError traceback
    ({"algorithm.name": "ifca", "algorithm.k": 10 ** 9}, "algorithm.k"),        # a 1 TB plan --dry-run passed
    ({"algorithm.name": "qffl", "algorithm.q": 1e5, "server.lr": 1.0}, "algorithm.q"),   # OverflowError in round 0
    ({"algorithm.name": "ditto", "algorithm.lam": 1e300}, "algorithm.lam"),    # float32 conversion in round 0
    ({"algorithm.name": "perfedavg", "algorithm.alpha": 1e300}, "algorithm.alpha"),
])
def test_issue_39_unbounded_numbers(entries, key):
    messages = refusal(entries)
    assert len(messages) == 1 and messages[0].startswith(f"{key} = ") and "must be" in messages[0], messages


def test_qffl_powers_overflow_to_inf_not_a_crash():
    """Within the bound, a diverged loss may still overflow F^q: inf (the run's non-finite handling), no
    OverflowError."""
    import math

    import torch

    from fedmpi.algorithms.qffl import qffl_upload

    delta, h = qffl_upload(torch.ones(3), 1e5, 100.0, 1.0)
    assert math.isinf(h) and torch.isinf(delta).all()


# --- keys made moot by another, from the components' declared reads -----------------------------------------

def _other_value(cls, key):
    """A valid value of `key` of section `cls` other than its default."""
    default = {f.name: f.default for f in dataclasses.fields(cls)}[key]
    rng = getattr(cls, "RANGES", {}).get(key)
    if rng is not None:
        middle = (rng.low + rng.high) / 2
        middle = int(middle) if isinstance(default, int) else middle
        return next(v for v in (middle, rng.high) if v != default and rng.holds(v))
    return {"clients": [1], "mapping": [3, 2, 1, 0], "perturbation": "unit", "sum_bound": "max",
            "noise_multiplier": 2.0, "delta": 1e-6, "tracking_uri": "file:x", "tracking_project": "p", "hidden": 7,
            "norm": "batch", "mlp_norm": "batch"}[key]


def _moot_cases():
    """(entries, the moot key, the key that makes it moot), one per declared form and key it does not read."""
    from fedmpi.config.run_sections import RuntimeConfig
    from fedmpi.config.sections import ModelConfig
    from fedmpi.secagg.keys import SecAggConfig

    every = {k for keys in ATTACK_USES.values() for k in keys}
    for name, reads in ATTACK_USES.items():
        for key in sorted(every - set(reads)):
            entries = {"attack.name": name, f"attack.{key}": _other_value(AttackConfig, key)}
            yield entries, f"attack.{key}", "attack.name"
    every = {k for keys in NOISE_USES.values() for k in keys}
    for noise, reads in NOISE_USES.items():
        for key in sorted(every - set(reads)):
            yield ({"server.secure_aggregation": "secagg", "secagg.noise": noise,
                    f"secagg.{key}": _other_value(SecAggConfig, key)}, f"secagg.{key}", "secagg.noise")
    every = {k for keys in TRACKER_USES.values() for k in keys}
    for trackers in ((), *((t,) for t in TRACKER_USES)):
        reads = {k for t in trackers for k in TRACKER_USES[t]}
        for key in sorted(every - reads):
            yield ({"runtime.trackers": list(trackers), f"runtime.{key}": _other_value(RuntimeConfig, key)},
                   f"runtime.{key}", "runtime.trackers")
    for key in MODEL_USES["built-in"]:
        yield ({"model.name": "torchvision:resnet18", f"model.{key}": _other_value(ModelConfig, key)},
               f"model.{key}", "model.name")
    yield {"data.name": "arrays", "data.root": "a.npz", "data.columns": {"x": "img"}}, "data.columns", "data.root"
    yield {"algorithm.name": "apfl", "algorithm.alpha_lr": 0.1}, "algorithm.alpha_lr", "algorithm.adaptive"
    yield ({"attack.name": "gaussian", "attack.fraction": 0.3, "attack.clients": [1]}, "attack.fraction",
           "attack.clients")


@pytest.mark.parametrize("entries, key, by", list(_moot_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_moot_key_is_refused_naming_the_key_that_makes_it_moot(entries, key, by):
    messages = refusal(entries)
    assert len(messages) == 1 and messages[0].startswith(f"{key} = ") and by in messages[0], messages
    # The same config without the moot key builds.
    from_dict(nested({k: v for k, v in entries.items() if k != key}))


def test_the_keys_each_form_reads_build():
    """Each attack with the keys it does read set builds: the declared reads are not too narrow."""
    for name, reads in ATTACK_USES.items():
        entries = {"attack.name": name, **{f"attack.{k}": _other_value(AttackConfig, k) for k in reads
                                           if k != "fraction"}}
        from_dict(nested(entries))


# --- omniscient attacks at set-up --------------------------------------------------------------------------------

@pytest.mark.parametrize("attack", OMNISCIENT_ATTACKS)
def test_omniscient_attacks_refuse_uniform_weighting_and_secure_aggregation(tmp_path, attack):
    """Both passed set-up and failed in round 0 (RuntimeError: upload weight 1.0 is not its sample count)."""
    out = tmp_path / "out"
    path = tmp_path / "c.yaml"
    path.write_text(f"seed: 1\nrounds: 1\nout: {quoted(str(out))}\ndata: {{name: synthetic}}\n"
                    f"partition: {{clients: 4, scheme: iid, samples_per_client: 20}}\nclient: {{batch_size: 10}}\n"
                    f"server: {{clients_per_round: 3}}\nruntime: {{threads: 1, progress: 'off'}}\n"
                    f"attack: {{name: {attack}, clients: [0]}}\n")
    for override, key in (("server.weighting=uniform", "server.weighting"),
                          ("server.secure_aggregation=secagg", "server.secure_aggregation")):
        for flag in ("--dry-run", "--overwrite"):
            outcome = cli("run", path, flag, override)
            assert outcome.code == 2 and not outcome.problems((2,)), (override, flag, outcome.err[-2000:])
            lines = [line for line in outcome.err.splitlines() if "error" in line]
            assert len(lines) == 1 and "attack.name" in lines[0] and key in lines[0], outcome.err
            assert not out.exists() or snapshot(out) == {}


# Numeric keys bounded by another rule than a declared range, each with that rule.
BOUNDED_ELSEWHERE = {
    "seed": "an integer in [0, 2^63): stored as a 64-bit integer (Config.__post_init__)",
    "runtime.client_state_memory": "a byte size, at most 2^63 - 1 (fedmpi.mpi.runtime.parse_bytes)",
    "runtime.gather_memory": "a byte size, at most 2^63 - 1 (fedmpi.mpi.runtime.parse_bytes)",
    "privacy.noise_multiplier": "0, or in the accountant's range [0.01 (pld: 0.3), 1e4] (fedmpi.privacy.keys.noise_ok)",
}


def _section_classes(cls=Config, prefix=""):
    """(dotted prefix, dataclass) of Config and every section below it."""
    yield prefix, cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _section_classes(hints[f.name], f"{prefix}{f.name}.")


@pytest.mark.parametrize("prefix, cls", list(_section_classes()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_numeric_key_of_every_section_is_bounded_at_both_ends(prefix, cls):
    """Issue 39: every numeric key of every section has a range that keeps the arithmetic finite, declared in
    its section's RANGES, except where BOUNDED_ELSEWHERE names the rule that bounds it: a key without one fails.
    H07: server.tau, server.robust's tau, bound and nu, server_data.beta, the schedules' step_rounds and rounds
    and client.compress.levels were accepted at 1e300 or 10^12 (a key some other check refused as unused
    passed the older form of this test). A value beyond either end, or far beyond, is refused with the range's
    own line, whatever else the config holds; the default lies inside the range."""
    hints = typing.get_type_hints(cls)
    ranges = getattr(cls, "RANGES", {})
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    numeric = [f.name for f in dataclasses.fields(cls) if _numeric(hints[f.name])
               and prefix + f.name not in BOUNDED_ELSEWHERE]
    assert not [k for k in numeric if k not in ranges], f"{prefix or 'Config'}: numeric keys without a declared range"
    for name in numeric:
        key, tp, rng = prefix + name, hints[name], ranges[name]
        assert defaults[name] is None or rng.holds(defaults[name]), (key, defaults[name], rng)
        integer = int in typing.get_args(tp) or tp is int
        beyond = [rng.high * 10 + 1, rng.low - 1, 1e300, -1e300] + [e for e, is_open in ((rng.low, rng.low_open),
                                                                                         (rng.high, rng.high_open))
                                                                   if is_open]
        for value in beyond:
            value = (max(min(int(value), 10 ** 15), -(10 ** 15)) if integer else float(value))
            if integer and value == int(value) and rng.holds(value):
                continue
            messages = refusal({key: value})
            assert f"{key} = {show(value)}: {rng.describe(integer, value)}" in messages, (key, value, messages)
