"""The examples' ground of the fuzz tests (tests/test_fuzz.py, tests/test_fuzz_inputs.py): a tiny real run as
YAML fragments (`tiny`), the folder every example runs in with the finished runs it copies (`make_work`, the
body of each module's `work` fixture), and `Case`, one example's copy of a finished run with the property
checked on it. Shared by the two modules, which split the generated inputs by topic (configs, overrides
and checkpoints; input files)."""

from __future__ import annotations

import os
import shutil

from fuzz_support import cli, quoted, run_status, snapshot, yaml_text
from hypothesis import event


def tiny(folder, **sections):
    """A tiny real run as YAML fragments: synthetic data, 2 clients, 1 round, the lr model, a checkpoint."""
    base = {"seed": "1", "rounds": "1", "out": quoted(str(folder)),
            "data": {"name": "synthetic"}, "partition": {"clients": "2", "scheme": "iid", "samples_per_client": "20"},
            "model": {"name": "lr"}, "client": {"batch_size": "10"}, "server": {"clients_per_round": "2"},
            "checkpoint": {"every": "1"}, "runtime": {"threads": "1", "progress": "'off'"}}
    for name, keys in sections.items():
        base[name] = {**base.get(name, {}), **keys} if isinstance(keys, dict) else keys
    return base


def make_work(tmp_path_factory):
    """The body of the fuzz test modules' `work` fixture (module scope): a folder to run in (relative paths in
    generated configs land here), fedmpi's parse cache inside it, and a finished tiny run `template` (plus one
    with state in every checkpoint group, `stateful`), made once."""
    root = tmp_path_factory.mktemp("fuzz")
    cwd, cache = os.getcwd(), os.environ.get("FEDMPI_CACHE_DIR")
    os.chdir(root)
    os.environ["FEDMPI_CACHE_DIR"] = str(root / "cache")
    try:
        for name, extra in (("template", {}), ("stateful", STATEFUL)):
            path = root / f"{name}.yaml"
            path.write_text(yaml_text(tiny(root / name, **extra), {}))
            cli("run", path).check((0,), f"making the {name} run")
        yield root
    finally:
        os.chdir(cwd)
        if cache is None:
            os.environ.pop("FEDMPI_CACHE_DIR", None)
        else:
            os.environ["FEDMPI_CACHE_DIR"] = cache


# SCAFFOLD (server and client controls), Adam (moments), a simulated clock (participation state).
STATEFUL = {"algorithm": {"name": "scaffold"}, "server": {"clients_per_round": "2", "optimizer": "adam", "lr": "0.1"},
            "partition": {"clients": "3", "scheme": "iid", "samples_per_client": "20"},
            "clients": {"speed": {"kind": "lognormal"}, "dropout": "0.2"}}


class Case:
    """One example's folder: a copy of a finished run in `out` and the config file beside it."""

    counter = 0

    def __init__(self, work, template="template"):
        Case.counter += 1
        self.dir = work / f"case{Case.counter:08d}"     # one length: generated text must not depend on it
        self.dir.mkdir()
        self.out = self.dir / "out"
        shutil.copytree(work / template, self.out)
        (self.out / ".fedmpi.lock").unlink(missing_ok=True)
        self.before = snapshot(self.out)

    def config(self, text):
        path = self.dir / "c.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        return path

    def check(self, outcome, what=""):
        """The property: exit 0 or 2 (or 1 for a diverged run), no traceback; the old run kept unless the
        new one succeeded (or started and diverged)."""
        diverged = outcome.code == 1 and run_status(self.out) == "diverged"
        event(f"exit {outcome.code}")       # --hypothesis-show-statistics: how many examples ran, how many refused
        outcome.check((0, 1, 2) if diverged else (0, 2), what)
        if outcome.code == 2:
            assert snapshot(self.out) == self.before, f"{what}\nexit 2 changed the old run\n{outcome.err[-2000:]}"
        shutil.rmtree(self.dir, ignore_errors=True)
