"""H12: a plug-in that raises is named in the one line fedmpi prints: its config key and its class, at build
(exit 2: set-up refuses the configuration it cannot build) and in a round (exit 1). Before, an upload stage whose
build() raised gave "fedmpi: KeyError: 'nope'", and a failing aggregator or server optimizer was not named
either. Every plug-in kind, each as a subclass of its shipped example (examples/), raising in its build (or
constructor) and in its round's method. Also: the keys of the shipped examples are checked at set-up."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import ROOT, small_config, write_config

from fedmpi.cli import main

FAILING = textwrap.dedent('''\
    from examples.cyclic_participation import Cyclic
    from examples.fedadam_scratch import FedAdamScratch
    from examples.meamed import MeanAroundMedian
    from examples.nesterov import Nesterov
    from examples.norm_clip_stage import NormClip
    from examples.norm_matched_noise import NormMatchedNoise


    def fail(self, *args, **kwargs):     # a method (self), or with classmethod() a build (self: the class)
        raise KeyError("nope")


    class StageBuild(NormClip):
        build = classmethod(fail)


    class StageRound(NormClip):
        client = fail


    class CyclicBuild(Cyclic):
        build = classmethod(fail)


    class CyclicRound(Cyclic):
        build = Cyclic.__dict__["build"]
        standard = fail


    class RuleBuild(MeanAroundMedian):
        __init__ = fail


    class RuleRound(MeanAroundMedian):
        aggregate = fail


    class OptimizerBuild(Nesterov):
        __init__ = fail


    class OptimizerRound(Nesterov):
        step = fail


    class AttackBuild(NormMatchedNoise):
        __init__ = fail


    class AttackRound(NormMatchedNoise):
        poison = fail


    class AlgorithmBuild(FedAdamScratch):
        name = "algorithm_build"
        __init__ = fail


    class AlgorithmRound(FedAdamScratch):
        name = "algorithm_round"
        aggregate = fail
''')


def _exit_code(argv):
    """main's status: a run that fails in a round ends the process (sys.exit) as it would under mpiexec. The
    `out` claims this process took are dropped after it, as a new process would start without them."""
    from fuzz_harness import release_claims

    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code
    finally:
        release_claims()


def _sections(kind, name):
    """The config sections that put the plug-in `name` (failing:CLASS) of `kind` in a run."""
    return {"stage": {"uploads": {"stages": [name]}},
            "participation": {"participation": {"name": name, "keys": {"groups": 2}}},
            "aggregator": {"server": {"clients_per_round": 5, "aggregator": name, "robust": {"f": 0}}},
            "optimizer": {"server": {"clients_per_round": 5, "optimizer": name, "momentum": 0.5}},
            "attack": {"attack": {"name": name, "fraction": 0.5}},
            "algorithm": {"algorithm": {"name": name}}}[kind]


KINDS = {"stage": ("uploads.stages", "Stage"), "participation": ("participation.name", "Cyclic"),
         "aggregator": ("server.aggregator", "Rule"), "optimizer": ("server.optimizer", "Optimizer"),
         "attack": ("attack.name", "Attack"), "algorithm": ("algorithm.name", "Algorithm")}


@pytest.mark.parametrize("when, code", [("Build", 2), ("Round", 1)])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_plug_in_that_raises_is_named_by_its_key_and_class(tmp_path, monkeypatch, capsys, kind, when, code):
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "failing.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "failing", raising=False)
    key, prefix = KINDS[kind]
    cls = prefix + when
    name = f"failing:{cls}"
    cfg = small_config(tmp_path / "out", rounds=1, **_sections(kind, name))
    assert _exit_code(["run", str(write_config(tmp_path / "c.yaml", cfg))]) == code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedmpi:")]
    assert len(lines) == 1, lines
    assert f"{key} = " in lines[0] and name in lines[0] and f"{cls}." in lines[0], lines
    assert lines[0].endswith("raised KeyError: 'nope'"), lines


# --- the shipped examples' keys, checked at set-up ----------------------------------------------------------

def _example_keys():
    """(config sections builder, dotted key, Range) of every key a shipped example reads from a free-form
    section (participation.keys, uploads.keys) or declares in its own keys dataclass (algorithm.*)."""
    import dataclasses
    import importlib

    from fedmpi.algorithms.base import AlgorithmKeys
    from fedmpi.plans.base import Participation
    from fedmpi.uploads.base import UploadStage

    sys.path.insert(0, str(ROOT))
    try:
        found = []
        for path in sorted((ROOT / "examples").glob("*.py")):
            module = importlib.import_module(f"examples.{path.stem}")
            for cls in vars(module).values():
                if not (isinstance(cls, type) and cls.__module__ == module.__name__):
                    continue
                name = f"examples.{path.stem}:{cls.__name__}"
                if issubclass(cls, Participation):
                    found += [(lambda k, v, n=name: {"participation": {"name": n, "keys": {k: v}}},
                               f"participation.keys.{key}", getattr(cls, "RANGES", {}).get(key)) for key in cls.uses]
                elif issubclass(cls, UploadStage):
                    found += [(lambda k, v, n=name: {"uploads": {"stages": [n], "keys": {k: v}}},
                               f"uploads.keys.{key}", getattr(cls, "RANGES", {}).get(key)) for key in cls.uses]
                elif isinstance(getattr(cls, "Keys", None), type) and issubclass(cls.Keys, AlgorithmKeys):
                    found += [(lambda k, v, n=name: {"algorithm": {"name": n, k: v}}, f"algorithm.{f.name}",
                               getattr(cls.Keys, "RANGES", {}).get(f.name))
                              for f in dataclasses.fields(cls.Keys) if f.type in ("float", "int", float, int)]
        return found
    finally:
        sys.path.remove(str(ROOT))


EXAMPLE_KEYS = _example_keys()


def test_the_examples_declare_keys_to_check():
    assert {"participation.keys.groups", "uploads.keys.max_norm", "algorithm.lr"} <= {k for _, k, _ in EXAMPLE_KEYS}


@pytest.mark.parametrize("sections, key, rng", EXAMPLE_KEYS, ids=[k for _, k, _ in EXAMPLE_KEYS])
def test_every_key_of_a_shipped_example_is_checked_at_set_up(tmp_path, monkeypatch, capsys, sections, key, rng):
    """H12: examples.cyclic_participation:Cyclic with groups: 0 was accepted and failed in round 1 with
    ZeroDivisionError, exit 1."""
    assert rng is not None, f"{key}: the example declares no range for it (RANGES)"
    monkeypatch.syspath_prepend(str(ROOT))
    short = key.rsplit(".", 1)[1]
    below = rng.low if rng.low_open else rng.low - 1
    for value in (below, rng.high * 10):
        cfg = small_config(tmp_path / "out", rounds=2, **sections(short, value))
        path = write_config(tmp_path / "c.yaml", cfg)
        for mode in (["--dry-run"], []):
            capsys.readouterr()
            assert _exit_code(["run", str(path), *mode]) == 2, (key, value, mode)
            lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedmpi:")]
            assert len(lines) == 1 and f"{key} = " in lines[0], (key, value, lines)
            assert not (tmp_path / "out").exists(), (key, value, mode)
