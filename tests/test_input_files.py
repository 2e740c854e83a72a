"""The input rule (fedmpi.core.input_files), over every file a command reads: each input, generated from the
registries where there is one (every file of every `data.name` that reads `data.root`, the three trace keys)
and listed otherwise (the config file, the sweep spec and its base config and index, the checkpoint and run
file of --resume and --fork-from, the run files of report / verify / export, the plays and the marker of
`fedmpi data shakespeare`), is given a FIFO, a link to /dev/zero and, where its format nests, a document nested
100,000 levels deep. Each must end with exit 2, one line naming the file, no traceback, within a generous
60 s (H04: the FIFO or the device was read forever; H09: a deep index.json was "fedmpi: RecursionError", exit
1), under `--dry-run` too. The cases run in child processes with a time and an address-space bound
(tests/input_case_runner.py), so that a regression fails instead of hanging the suite."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dataset_files import emnist_names, write_cifar, write_leaf, write_mnist_family

from fedmpi import config
from fedmpi.data import leaf_binary, load_dataset
from fedmpi.data.dataset import to_arrays
from fedmpi.data.sources import USES
from fedmpi.io import checkpoint

ROOT = Path(__file__).resolve().parents[1]
CASE_SECONDS = float(os.environ.get("FEDMPI_INPUT_CASE_SECONDS", 60))  # "forever" is what this bound catches
BUDGET_SECONDS = 600    # all cases (about 240, 90 s on a loaded 2-core machine); none starts after it
DEEP = "[" * 100_000 + "]" * 100_000        # JSON and YAML (flow) alike
BASE = {"seed": 1, "rounds": 1, "data": {"name": "synthetic"},
        "partition": {"clients": 2, "scheme": "iid", "samples_per_client": 20}, "model": {"name": "lr"},
        "client": {"batch_size": 10}, "server": {"clients_per_round": 2}, "checkpoint": {"every": 1},
        "runtime": {"threads": 1, "progress": "off"}}
NESTED = (".json", ".yaml")     # the formats a deep document applies to


def config_text(out, **sections):
    cfg = json.loads(json.dumps(BASE))
    cfg["out"] = str(out)
    for name, keys in sections.items():
        cfg[name] = {**cfg.get(name, {}), **keys} if isinstance(keys, dict) else keys
    return json.dumps(cfg)      # JSON is YAML


# --- data.root: a writer per source that reads files, its files found on disk --------------------------------

def _mnist5k(root):
    rows = np.concatenate([np.arange(20)[:, None] % 10, np.full((20, 784), 7)], axis=1)
    with gzip.open(root / "mnist_5k.csv.gz", "wt") as fh:
        np.savetxt(fh, rows, fmt="%d", delimiter=",")


def _shakespeare(root):
    write_leaf(root, "shakespeare", files=2)
    data = config.from_dict({"data": {"name": "shakespeare", "root": str(root)}, "model": {"name": "lstm"},
                             "partition": {"clients": 2, "scheme": "natural"}, "server": {"clients_per_round": 1}})
    leaf_binary.write(str(root), to_arrays(load_dataset(data)))


def _arrays(suffix):
    def write(root):
        g = np.random.default_rng(0)
        arrays = {"x_train": g.normal(size=(20, 5)).astype(np.float32), "y_train": np.arange(20) % 2,
                  "x_test": g.normal(size=(6, 5)).astype(np.float32), "y_test": np.arange(6) % 2}
        if suffix == ".npz":
            np.savez(root / "d.npz", **arrays)
        else:
            import h5py

            with h5py.File(root / "d.h5", "w") as f:
                for k, v in arrays.items():
                    f[k] = v
        return root / f"d{suffix}"
    return write


DATA_WRITERS = {  # data.name -> [(variant, writer(root) -> data.root or None for root itself, model)]
    "mnist5k": [("", _mnist5k, "lr")],
    "mnist": [("", lambda r: write_mnist_family(r, n_train=20, n_test=10), "lr")],
    "fashion_mnist": [("", lambda r: write_mnist_family(r, "FashionMNIST", n_train=20, n_test=10), "lr")],
    "emnist": [("", lambda r: write_mnist_family(r, "EMNIST", n_train=47, n_test=47, classes=47,
                                                  names=emnist_names("balanced")), "lr")],
    "cifar10": [("", lambda r: write_cifar(r, "cifar10", n_train=20, n_test=10), "lr")],
    "cifar100": [("", lambda r: write_cifar(r, "cifar100", n_train=20, n_test=10), "lr")],
    "femnist": [("", lambda r: write_leaf(r, "femnist", files=2), "lr")],
    "shakespeare": [("", _shakespeare, "lstm")],
    "arrays": [(".npz", _arrays(".npz"), "lr"), (".h5", _arrays(".h5"), "lr")],
}


def test_every_source_that_reads_data_root_has_a_writer_here():
    assert set(DATA_WRITERS) == {name for name, keys in USES.items() if "root" in keys}


def data_inputs(base):
    """[(site, folder to copy, data.name, data.root relative to it, model, a file read, relative)] for every
    file of every source that reads data.root."""
    found = []
    for name, variants in DATA_WRITERS.items():
        for variant, write, model in variants:
            folder = base / f"{name}{variant}"
            folder.mkdir(parents=True)
            given = write(folder)
            root = given if isinstance(given, Path) else folder
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                rel = path.relative_to(folder)
                found.append((f"data.root[{name}{variant}]/{rel}", folder, name, root.relative_to(folder), model,
                              rel))
    return found


# --- the cases ------------------------------------------------------------------------------------------------

def spoil(path, kind):
    """`path` made a FIFO, a link to /dev/zero, or a text nested 100,000 levels deep."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    else:
        path.write_text(DEEP)


def kinds_of(path):
    return ("fifo", "zero", "deep") if Path(path).suffix in NESTED else ("fifo", "zero")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run with a checkpoint after round 1 (`parent`), made once."""
    base = tmp_path_factory.mktemp("finished")
    (base / "c.yaml").write_text(config_text(base / "parent"))
    done = subprocess.run([sys.executable, "-m", "fedmpi", "run", str(base / "c.yaml")], cwd=base,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return base / "parent"


def build_cases(base, parent):
    """[(id, cwd, argv, the spoiled file)]; each case in a folder of its own."""
    cases = []

    def case(site, kind, argv, target, prepare=None, dry=(False, True), named=None):
        for dry_run in dry:
            cid = f"{site}:{kind}" + (":dry-run" if dry_run else "")
            folder = base / f"case{len(cases):04d}"
            folder.mkdir()
            if prepare:
                prepare(folder)
            if not (folder / "c.yaml").exists():
                (folder / "c.yaml").write_text(config_text(folder / "out"))
            spoil(folder / target, kind)
            cases.append((cid, str(folder), argv + (["--dry-run"] if dry_run else []), named or Path(target).name))

    for kind in kinds_of("c.yaml"):
        case("config file", kind, ["run", "c.yaml"], "c.yaml")

    def spec(folder):
        (folder / "s.yaml").write_text(json.dumps({"base": "c.yaml", "out": "sw", "grid": {"client.lr": [0.1]}}))
        (folder / "sw").mkdir()
    for kind in kinds_of("s.yaml"):
        case("sweep spec", kind, ["sweep", "s.yaml"], "s.yaml", spec, dry=(True,))
        case("sweep spec's base config", kind, ["sweep", "s.yaml"], "c.yaml", spec, dry=(True,))
    for kind in kinds_of("i.csv"):
        case("sweep index", kind, ["sweep", "s.yaml"], "sw/index.csv", spec, dry=(True,))

    for key, columns, section in (
            ("clients.trace", "client,start,end\n0,0,inf\n1,0,inf\n", {"availability": "trace"}),
            ("clients.speed.trace", "client,steps_per_s\n0,10\n1,10\n", {"speed": {"kind": "trace"}}),
            ("clients.bandwidth.trace", "client,up_bytes_per_s,down_bytes_per_s\n0,1e6,1e6\n1,1e6,1e6\n",
             {"bandwidth": {"kind": "trace"}})):
        def trace(folder, key=key, columns=columns, section=section):
            keys = json.loads(json.dumps(section))
            if key == "clients.trace":
                keys["trace"] = "t.csv"
            else:
                next(iter(keys.values()))["trace"] = "t.csv"
            (folder / "t.csv").write_text(columns)
            (folder / "c.yaml").write_text(config_text(folder / "out", clients=keys))
        for kind in kinds_of("t.csv"):
            case(key, kind, ["run", "c.yaml"], "t.csv", trace)

    for site, source, name, root, model, rel in data_inputs(base / "data"):
        def data(folder, source=source, name=name, root=root, model=model):
            shutil.copytree(source, folder / "d")
            extra = {"partition": {"clients": 2, "scheme": "natural"}} if name in ("femnist", "shakespeare") else {}
            (folder / "c.yaml").write_text(config_text(folder / "out", data={"name": name, "root": f"d/{root}"},
                                                       model={"name": model}, **extra))
        for kind in kinds_of(rel):
            case(site, kind, ["run", "c.yaml"], f"d/{rel}", data)

    ckpt = os.path.relpath(checkpoint.ckpt_path(str(parent), 1), parent)

    def copy_parent(folder):
        shutil.copytree(parent, folder / "out")
        (folder / "out" / ".fedmpi.lock").unlink(missing_ok=True)
    real = (False,)     # `--dry-run` checks the config and data, not what --resume / --fork-from would read
    for kind in ("fifo", "zero"):
        case("--resume checkpoint", kind, ["run", "c.yaml", "--resume", "rounds=2"], f"out/{ckpt}", copy_parent,
             dry=real)
        case("--resume run.h5", kind, ["run", "c.yaml", "--resume", "rounds=2"], "out/run.h5", copy_parent, dry=real)
        case("--fork-from checkpoint", kind, ["run", "c.yaml", "--fork-from", "out@1", "out=fork", "rounds=2"],
             f"out/{ckpt}", copy_parent, dry=real)
        case("--fork-from run.h5", kind, ["run", "c.yaml", "--fork-from", "out@1", "out=fork", "rounds=2"],
             "out/run.h5", copy_parent, dry=real)
        case("report RUN_FOLDER", kind, ["report", "out"], "out/run.h5", copy_parent, dry=(False,))
        case("report RUN_FILE", kind, ["report", "out/run.h5"], "out/run.h5", copy_parent, dry=(False,))
        case("verify", kind, ["verify", "out/run.h5", str(parent / "run.h5")], "out/run.h5", copy_parent,
             dry=(False,))
        case("export", kind, ["export", "out", "--csv", "x.csv"], "out/run.h5", copy_parent, dry=(False,))
        case("data shakespeare --from", kind, ["data", "shakespeare", "--from", "plays", "--out", "built"],
             "plays/a.md", dry=(False,))

    def built(folder):
        (folder / "built").mkdir()
    for kind in kinds_of("build.json"):
        case("data shakespeare --out's marker", kind, ["data", "shakespeare", "--from", "plays", "--out", "built",
             "--overwrite"], "built/build.json", lambda f: (built(f), (f / "plays").mkdir()), dry=(False,),
             named="built")     # not a marker this command wrote: the folder is refused, by its name
    return cases


@pytest.fixture(scope="module")
def outcomes(finished, tmp_path_factory):
    base = tmp_path_factory.mktemp("inputs")
    cases = build_cases(base, finished)
    listing = base / "cases.json"
    listing.write_text(json.dumps([{"id": c, "cwd": cwd, "argv": argv} for c, cwd, argv, _ in cases]))
    results = base / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        runner = subprocess.run([sys.executable, str(Path(__file__).with_name("input_case_runner.py")), str(listing),
                                 str(results), str(CASE_SECONDS), str(BUDGET_SECONDS)], cwd=base, env=env,
                                capture_output=True, text=True, timeout=BUDGET_SECONDS + CASE_SECONDS + 60)
        said = runner.stderr[-2000:]
    except subprocess.TimeoutExpired:
        said = "the runner ran past its time"
    found = json.loads(results.read_text()) if results.exists() else {}
    return {c: (found.get(c) or {"missing": said}, named) for c, _, _, named in cases}


@pytest.mark.timeout(BUDGET_SECONDS + 300)     # the cases are made and run in the first test's set-up
def test_every_input_refuses_a_fifo_a_device_and_a_deep_document(outcomes):
    failures = []
    for cid, (got, named) in outcomes.items():
        if "missing" in got:
            failures.append(f"{cid}: not run (the runner stopped: {got['missing']})")
        elif got["hung"]:
            failures.append(f"{cid}: still running after {CASE_SECONDS:.0f} s (killed)")
        elif got["code"] != 2 or "Traceback" in got["err"] or named not in got["err"]:
            failures.append(f"{cid}: exit {got['code']}, stderr: {got['err'][-600:]!r}")
    assert not failures, f"{len(failures)} of {len(outcomes)} cases:\n" + "\n".join(failures)


@pytest.mark.timeout(BUDGET_SECONDS + 300)
def test_the_cases_cover_each_kind_and_dry_run(outcomes):
    ids = list(outcomes)
    assert {"fifo", "zero", "deep"} <= {c.split(":")[1] for c in ids}
    assert any(c.endswith(":dry-run") for c in ids) and len(ids) > 150


# --- the rule's two checks, one at a time -------------------------------------------------------------------------

def test_a_file_swapped_after_the_check_by_path_is_refused_on_its_descriptor(tmp_path, monkeypatch):
    """The check by path passed (as for a regular file replaced by a FIFO just after it): opening does not wait
    for a writer (O_NONBLOCK) and the descriptor's fstat refuses it."""
    from fedmpi.core import input_files
    from fedmpi.core.errors import InputError

    fifo = tmp_path / "swapped.yaml"
    os.mkfifo(fifo)
    monkeypatch.setattr(input_files, "check_input", lambda *args, **kwargs: None)
    with pytest.raises(InputError, match="swapped.yaml: a FIFO"):
        input_files.read_input(fifo, "swapped.yaml")


def test_reads_stop_at_the_size_and_json_depth_is_bounded(tmp_path):
    from fedmpi.core import input_files
    from fedmpi.core.errors import InputError

    path = tmp_path / "f.json"
    path.write_text('{"a": [[1]]}')
    assert input_files.read_input(path, at_most=4) == b'{"a"'
    assert input_files.parse_json(input_files.read_input(path), "f.json", max_depth=3) == {"a": [[1]]}
    with pytest.raises(InputError, match="f.json: JSON nested deeper than 2"):
        input_files.parse_json(path.read_text(), "f.json", max_depth=2)
    with pytest.raises(InputError, match="f.json: JSON nested too deeply"):
        input_files.parse_json(DEEP, "f.json")
