"""Issue 29: a property-based fuzz suite (Hypothesis). Configs and overrides are generated from the config
dataclasses' own fields (tests/fuzz_support.py walks `Config` with `dataclasses.fields` and
`typing.get_type_hints`), input files from their formats (YAML configs, LEAF JSON, idx files, CIFAR python
batches, availability/speed/bandwidth traces, checkpoints with perturbed datasets).

The property, for every example: `fedmpi run` exits 0 or 2 (1 only for a run that diverged, which is a run
that started: fedmpi's documented outcome for a NaN model), never with a traceback, within EXAMPLE_SECONDS and
within EXTRA_ADDRESS_SPACE more address space (fuzz_support.bounded); and the finished run already in `out` is
byte-identical afterwards (every file hashed before and after) unless the new run succeeded.

Most examples run in this process through `fedmpi.cli.main` (a dry run takes milliseconds, a tiny real run of
synthetic data, 2-3 clients, 1 round, a few tenths of a second); a few run `python -m fedmpi` in a subprocess,
where a real process matters (its exit status, its stderr, RLIMIT_AS of its own).

Profiles: CI (the default) draws a fixed set of examples (derandomize=True, no example database);
FEDMPI_FUZZ=nightly draws 20x as many, fresh each run (a failure prints the blob that reproduces it:
@reproduce_failure). Issue 39's three findings that only the nightly budget reached (IFCA's algorithm.k =
10^15, a scalar attack.clients, a checkpoint dataset emptied to no entries) are reached by CI as well: every
key is tried in the wrong form and every integer key far beyond any machine on every run (parametrized, not
drawn), and emptying a dataset is its own perturbation. Those add about 13 s of CPU to the file's ~45 s
(measured on two shared cores: 43.5 s before and 56 s after, without the checkpoint test; that test ~14 s).

Each of issue 29's findings 6 and 7 also has its own case here (`FINDINGS`): the generators reach the first
kind (tracebacks) by themselves, but a key accepted without effect exits 0, which the property allows.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import struct
import subprocess
import sys
import typing

import h5py
import numpy as np
import pytest
from conftest import ROOT
from dataset_files import write_cifar, write_leaf, write_mnist_family
from fuzz_support import (
    HOSTILE_SCALARS,
    algorithm_owners,
    cli,
    config_entries,
    config_fields,
    examples,
    hostile,
    mutated,
    quoted,
    release_claims,
    run_status,
    snapshot,
    wrong_form_entry,
    wrong_forms,
    yaml_text,
)
from hypothesis import event, example, given
from hypothesis import strategies as st

from fedmpi.io.checkpoint import checksum_of


def tiny(folder, **sections):
    """A tiny real run as YAML fragments: synthetic data, 2 clients, 1 round, the lr model, a checkpoint."""
    base = {"seed": "1", "rounds": "1", "out": quoted(str(folder)),
            "data": {"name": "synthetic"}, "partition": {"clients": "2", "scheme": "iid", "samples_per_client": "20"},
            "model": {"name": "lr"}, "client": {"batch_size": "10"}, "server": {"clients_per_round": "2"},
            "checkpoint": {"every": "1"}, "runtime": {"threads": "1", "progress": "'off'"}}
    for name, keys in sections.items():
        base[name] = {**base.get(name, {}), **keys} if isinstance(keys, dict) else keys
    return base


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder to run in (relative paths in generated configs land here), fedmpi's parse cache inside it,
    and a finished tiny run `template` (plus one with state in every checkpoint group, `stateful`), made once."""
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


FIELDS = config_fields()
DRY_FIELDS = [(k, tp) for k, tp in FIELDS if k != "data.download"]     # true would fetch data sets from the web
# A real run fuzzes the keys that do not choose the data, the model or where it writes (those decide what is
# trained: a resnet18 on mnist5k is a valid run of minutes), integers kept small.
REAL_FIELDS = [(k, tp) for k, tp in DRY_FIELDS if k not in ("out", "data.name", "data.root", "model.name")]


def test_the_fields_are_the_config_dataclasses_own():
    keys = {k for k, _ in FIELDS}
    assert {"seed", "client.lr_schedule.gamma", "clients.speed.sigma", "privacy.noise_multiplier",
            "runtime.client_state_memory", "algorithm.mu", "algorithm.buffer_size", "server.betas"} <= keys
    assert len(keys) > 100


# --- configs and overrides ----------------------------------------------------------------------------------

@examples(120)
@given(entries=config_entries(DRY_FIELDS, sizes="any"))
def test_a_generated_config_file_dry_runs_or_is_refused(work, entries):
    case = Case(work)
    path = case.config(yaml_text(tiny(case.out), entries))
    case.check(cli("run", path, "--dry-run"), path.read_text()[-3000:])


WRONG_FORM_KEYS = [(k, tp) for k, tp in DRY_FIELDS if wrong_forms(tp)]
INTEGER_KEYS = [k for k, tp in DRY_FIELDS if typing.get_origin(tp) is not tuple
                and int in ([a for a in typing.get_args(tp) if a is not type(None)] or [tp])]


@pytest.mark.parametrize("key, tp", WRONG_FORM_KEYS, ids=[k for k, _ in WRONG_FORM_KEYS])
@examples(2)
@given(data=st.data(), where=st.sampled_from(["file", "override"]))
def test_a_key_of_the_wrong_form_is_one_line_naming_it(work, key, tp, data, where):
    """Issue 39: every declared key given a value of a form its type does not take (a scalar for a list, a
    list for a number, a tag YAML cannot build) exits 2 with one line naming the key, in a file or as an
    override. Every key, every run: a drawn key would leave most keys out of a CI budget."""
    entries = data.draw(wrong_form_entry(key, tp))
    case = Case(work)
    if where == "file":
        outcome = cli("run", case.config(yaml_text(tiny(case.out), entries)), "--dry-run")
    else:
        path = case.config(yaml_text(tiny(case.out), {k: v for k, v in entries.items() if k != key}))
        outcome = cli("run", path, "--dry-run", f"{key}={entries[key]}")
    lines = outcome.err.strip().splitlines()
    assert outcome.code == 2 and len(lines) == 1 and key in lines[0], (entries, where, outcome.err[-2000:])
    case.check(outcome, entries)


@pytest.mark.parametrize("key", INTEGER_KEYS)
@examples(1)
@given(value=st.integers(10 ** 15, 2 ** 63 - 1))
def test_an_integer_key_far_beyond_any_machine_dry_runs_or_is_refused(work, key, value):
    """Every integer key at a value no machine holds that many of (issue 39: IFCA's algorithm.k = 10^15 was a
    MemoryError traceback in --dry-run, found only by the nightly budget): refused or planned, never a crash."""
    entries = {key: str(value)}
    if key.startswith("algorithm.") and key != "algorithm.name":
        entries["algorithm.name"] = algorithm_owners()[key][0]
    case = Case(work)
    case.check(cli("run", case.config(yaml_text(tiny(case.out), entries)), "--dry-run"), entries)


BAD_OVERRIDES = ("=1", "rounds", ".=1", "a..b=1", "rounds.x=1", "algorithm=fedavg", "algorithm.name.x=1",
                 "clients=5", "data=synthetic", "client.lr_schedule=cosine", "out.x=1", "seed==1", " rounds = 2 ",
                 "rounds=1=2", "\udc80=1", "rounds=\udcff", "privacy.=1", "nosuch.key=1", "client.lr_schedule.x=1")


def overrides(fields, sizes, max_keys=4):
    entry = config_entries(fields, sizes, max_keys).map(lambda d: [f"{k}={v}" for k, v in d.items()])
    bad = st.one_of(st.just([]), st.just([]), st.just([]), st.sampled_from(BAD_OVERRIDES).map(lambda b: [b]))
    return st.tuples(entry, bad).map(lambda p: p[0] + p[1])


@examples(120)
@given(items=overrides(DRY_FIELDS, "any"))
def test_generated_overrides_dry_run_or_are_refused(work, items):
    case = Case(work)
    path = case.config(yaml_text(tiny(case.out), {}))
    case.check(cli("run", path, "--dry-run", *items), items)


MODES = ([], ["--overwrite"], ["--overwrite"], ["--resume", "rounds=2"], ["--fork-from", "PARENT@1", "--overwrite"],
         ["--fork-from", "PARENT@1", "--overwrite"])


@examples(50)
@given(items=overrides(REAL_FIELDS, "small", max_keys=2), mode=st.sampled_from(MODES))
def test_generated_overrides_on_a_real_run_keep_the_old_run_unless_it_succeeds(work, items, mode):
    case = Case(work)
    parent = case.dir / "parent"
    shutil.copytree(work / "template", parent)
    kept = snapshot(parent)
    path = case.config(yaml_text(tiny(case.out), {}))
    mode = [m.replace("PARENT", str(parent)) for m in mode]
    outcome = cli("run", path, *mode, *items)
    assert snapshot(parent) == kept, f"{items} {mode}: a fork changed its parent"
    case.check(outcome, (items, mode))


@examples(60)
@given(data=st.data())
def test_a_damaged_config_file_is_refused_or_runs(work, data):
    case = Case(work)
    text = yaml_text(tiny(case.out), data.draw(config_entries(DRY_FIELDS, max_keys=2)))
    case.check(cli("run", case.config(data.draw(mutated(text))), "--dry-run"))


# --- input files --------------------------------------------------------------------------------------------

def _json_value():
    return st.one_of(st.integers(-3, 300), st.floats(), st.booleans(), st.none(), st.text(max_size=3),
                     st.lists(st.integers(0, 3), max_size=2))


@st.composite
def leaf_blob(draw, kind):
    """A LEAF file's dict: users, num_samples, user_data{user: {x, y}}, mostly well formed, some of it not."""
    users = draw(st.lists(st.one_of(st.sampled_from(["u0", "u1", "u2"]), st.text(max_size=4)), min_size=1,
                          max_size=3))
    data = {}
    for user in users:
        n = draw(st.integers(0, 4))
        if kind == "femnist":
            pixel = draw(st.one_of(st.floats(0, 1), _json_value()))
            width = draw(st.sampled_from([784, 784, 784, 783, 0, 785]))
            x = [[pixel] * width for _ in range(n)]
            if x and width and draw(st.booleans()):
                x[0][draw(st.integers(0, max(0, width - 1)))] = draw(_json_value())
            y = draw(st.lists(st.one_of(st.integers(0, 61), _json_value()), min_size=n, max_size=n + 1))
        else:
            char = draw(st.one_of(st.sampled_from("abc \n"), st.characters()))
            x = [char * draw(st.sampled_from([80, 80, 79, 81])) for _ in range(n)]
            y = draw(st.lists(st.one_of(st.sampled_from("abc"), st.characters(), _json_value()), min_size=n,
                              max_size=n + 1))
        data[user] = draw(st.sampled_from([{"x": x, "y": y}, {"x": x}, {"y": y}, x]))
    blob = {"users": users, "num_samples": [len(v["y"]) if isinstance(v, dict) and "y" in v else 0
                                            for v in data.values()], "user_data": data}
    return draw(st.sampled_from([blob, blob, blob, {**blob, "users": users + ["ghost"]}, users, None]))


def leaf_text(blob):
    """JSON text of `blob`, with JSON's own hostile spellings: NaN, 1e999, lone surrogate escapes."""
    return json.dumps(blob, allow_nan=True)


@examples(50)
@given(kind=st.sampled_from(["femnist", "shakespeare"]), data=st.data())
def test_generated_leaf_files_run_or_are_refused(work, kind, data):
    case = Case(work)
    root = case.dir / "leaf"
    write_leaf(root, kind, users_train=(4, 3), users_test=(2, 2), files=1)
    target = root / data.draw(st.sampled_from(["train", "test"])) / data.draw(st.sampled_from(["a.json", "z.json"]))
    text = leaf_text(data.draw(leaf_blob(kind)))
    target.write_bytes(data.draw(st.one_of(st.just(text.encode()), mutated(text))))
    model = "lr" if kind == "femnist" else "lstm"
    path = case.config(yaml_text(tiny(case.out, data={"name": kind, "root": quoted(str(root))},
                                      model={"name": model}, partition={"clients": "2", "scheme": "iid"}), {}))
    case.check(cli("run", path, "--overwrite"), target.read_bytes()[:2000])


IDX_FAULTS = ("magic", "code", "dims", "size", "length", "truncated", "labels")


@st.composite
def idx_bytes(draw, ndim, count):
    """An idx file (two zero bytes, the type code, the dimensions, big-endian sizes, the data): valid, or with
    one thing wrong; the labels' values are any byte (a label beyond the classes is a wrong file too)."""
    fault = draw(st.one_of(st.none(), st.none(), st.sampled_from(IDX_FAULTS)))
    zeros, code, sizes = b"\0\0", 0x08, [count] + [28] * (ndim - 1)
    if fault == "magic":
        zeros = draw(st.sampled_from([b"\0\x01", b"", b"\xff\xff", b"\0"]))
    elif fault == "code":
        code = draw(st.sampled_from([0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x00, 0xFF]))
    elif fault == "dims":
        sizes = sizes[:1] * draw(st.sampled_from([0, 2, 4, 9]))
    elif fault == "size":
        sizes[draw(st.integers(0, ndim - 1))] = draw(st.sampled_from([0, 1, 27, 29, 2 ** 32 - 1, 2 ** 31]))
    header = zeros + bytes([code, len(sizes)]) + struct.pack(f">{len(sizes)}I", *sizes)
    length = int(np.prod(sizes, dtype=object)) if sizes else 0
    if fault == "length":
        length += draw(st.sampled_from([-1, 1, -784, 784]))
    top = 255 if fault == "labels" else 9
    data = bytes(draw(st.integers(0, top)) for _ in range(min(max(0, length), 64)))
    length = max(0, min(length, 1 << 20))       # a header may announce 4 GiB: the file holds at most 1 MiB
    data = (data * (length // max(1, len(data)) + 1))[:length]
    blob = header + data
    return blob[:draw(st.integers(0, len(blob) - 1))] if fault == "truncated" and blob else blob


@examples(50)
@given(data=st.data())
def test_generated_idx_files_run_or_are_refused(work, data):
    case = Case(work)
    root = case.dir / "idx"
    write_mnist_family(root, n_train=20, n_test=10)
    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    which = data.draw(st.sampled_from(names))
    count = 20 if which.startswith("train") else 10
    (root / "MNIST" / "raw" / which).write_bytes(data.draw(idx_bytes(3 if "images" in which else 1, count)))
    path = case.config(yaml_text(tiny(case.out, data={"name": "mnist", "root": quoted(str(root))},
                                      partition={"clients": "2", "scheme": "iid"}), {}))
    case.check(cli("run", path, "--overwrite", *data.draw(st.sampled_from([[], ["runtime.shared_data=false"]]))),
               which)


class _Marker:
    """Pickles as a call that creates a file: what a crafted batch that runs code would do."""

    def __init__(self, call, marker):
        self.call, self.marker = call, str(marker)

    def __reduce__(self):
        if self.call == "exec":
            return exec, (f"open({self.marker!r}, 'w').write('ran')",)
        if self.call == "system":
            return os.system, (f"touch {self.marker}",)
        return open, (self.marker, "w")


def _pickled_value(marker):
    arrays = st.builds(lambda dt, shape, v: np.full(shape, v).astype(dt),
                       st.sampled_from(["u1", "u1", "i8", "f4", "f8", "?", "U1", "O"]),
                       st.sampled_from([(4, 3072), (4, 3072), (4, 3071), (3072,), (0, 3072), (4, 3, 32, 32), ()]),
                       st.integers(0, 300))
    return st.one_of(arrays, st.lists(st.integers(-1, 12), max_size=5), st.none(), st.text(max_size=3),
                     st.binary(max_size=8), st.floats(), st.sampled_from(["exec", "system", "open"]).map(
                         lambda c: _Marker(c, marker)))


@st.composite
def cifar_batch(draw, marker):
    """A CIFAR-10 python batch: a pickled dict with data and labels (values of every kind, code-running
    payloads among them), at any protocol, then possibly damaged byte by byte."""
    entry = {"data": np.zeros((4, 3072), np.uint8), "labels": [0, 1, 2, 3]}
    for key in draw(st.lists(st.sampled_from(["data", "labels", "extra"]), max_size=2, unique=True)):
        entry[key] = draw(_pickled_value(marker))
    if draw(st.booleans()):
        entry = {k.encode(): v for k, v in entry.items()}
    blob = pickle.dumps(draw(st.sampled_from([entry, entry, entry, [entry], "x"])),
                        protocol=draw(st.integers(0, 5)))
    return draw(st.one_of(st.just(blob), st.just(blob), st.tuples(st.integers(0, len(blob) - 1), st.integers(0, 255))
                          .map(lambda p: blob[:p[0]] + bytes([p[1]]) + blob[p[0] + 1:]),
                          st.integers(0, len(blob)).map(lambda i: blob[:i])))


@examples(60)
@given(data=st.data())
def test_generated_cifar_batches_never_run_code(work, data):
    case = Case(work)
    root = case.dir / "cifar"
    write_cifar(root, "cifar10", n_train=20, n_test=10)
    marker = case.dir / "marker"
    name = data.draw(st.sampled_from(["data_batch_1", "data_batch_5", "test_batch"]))
    (root / "cifar-10-batches-py" / name).write_bytes(data.draw(cifar_batch(marker)))
    path = case.config(yaml_text(tiny(case.out, data={"name": "cifar10", "root": quoted(str(root))},
                                      partition={"clients": "2", "scheme": "iid"}), {}))
    outcome = cli("run", path, "--overwrite")
    assert not marker.exists(), "a CIFAR batch ran code"
    case.check(outcome, name)


def _cell(kind):
    """A trace's cell: a valid value (3 in 4) or a hostile one."""
    good = {"client": st.integers(0, 3).map(str), "time": st.integers(0, 100).map(str),
            "rate": st.sampled_from(["1", "10", "0.5", "1e6", "100"])}[kind]
    bad = {"client": ["-1", "1.5", "1e3", "1000000000", "1" + "0" * 12, "9" * 5000, "x", "", "0x1", " 1", "1_0"],
           "time": ["inf", "-inf", "nan", "-1", "1e308", "1e309", "1e-300", "x", "", "0x10", "1_0", "infinity"],
           "rate": ["0", "-1", "1e-7", "1e16", "inf", "nan", "x", "", "1e308"]}[kind]
    return st.one_of(good, good, good, st.sampled_from(bad))


TRACES = {  # key in the config, its columns, the kinds of cell per column
    "availability": ("client,start,end", ("client", "time", "time")),
    "speed": ("client,steps_per_s", ("client", "rate")),
    "bandwidth": ("client,up_bytes_per_s,down_bytes_per_s", ("client", "rate", "rate")),
}


@st.composite
def trace_text(draw, which):
    header, kinds = TRACES[which]
    first_row = ["100" if k != "time" else ("0" if i == 1 else "inf") for i, k in enumerate(kinds[1:], 1)]
    rows = [",".join(["0", *first_row])]
    for i, cells in enumerate(draw(st.lists(st.tuples(*(_cell(k) for k in kinds)), max_size=4)), 1):
        # a rate trace lists each device once: a valid id is the row's own
        first = str(i) if which != "availability" and cells[0] in "0123" and cells[0] else cells[0]
        rows.append(",".join((first, *cells[1:])))
    head = draw(st.sampled_from([header] * 6 + [header + ",x", header.upper(), "", "# comment\n" + header]))
    extra = draw(st.lists(st.sampled_from(["", "# note", "1,2", "0,1,2,3", "\x00", "\ufeff0,1,2"]), max_size=1))
    return "\n".join([head, *rows, *extra]) + draw(st.sampled_from(["\n", "", "\r\n"]))


@examples(60)
@given(which=st.sampled_from(sorted(TRACES)), data=st.data())
def test_generated_traces_run_or_are_refused(work, which, data):
    case = Case(work)
    trace = case.dir / "trace.csv"
    text = data.draw(trace_text(which))
    trace.write_bytes(data.draw(st.one_of(st.just(text.encode("utf-8")), st.just(text.encode("utf-8")), mutated(text))))
    keys = {"availability": {"availability": "trace", "trace": quoted(str(trace))},
            "speed": {"speed": {"kind": "trace", "trace": quoted(str(trace))}},
            "bandwidth": {"bandwidth": {"kind": "trace", "trace": quoted(str(trace))}}}[which]
    if which == "availability" and data.draw(st.booleans()):
        keys["trace_period"] = data.draw(st.sampled_from(["10", "1e-9", "1e308"]))
    path = case.config(yaml_text(tiny(case.out, clients=keys), {}))
    case.check(cli("run", path, "--overwrite"), text[:2000])


# --- checkpoints --------------------------------------------------------------------------------------------

DATASETS = ("global", "server/c", "optimizer/m", "optimizer/v", "participation/sim_time_s", "clients/0/c_i")
ATTRS = ("round", "wall_s", "config", "config_hash", "fedmpi_version", "format", "seed")


def _attr_value():
    return st.one_of(st.integers(-2, 3), st.floats(), st.text(max_size=8), st.sampled_from(
        [b"bytes", np.array([1, 2]), np.float32(1.5), np.bool_(True), "round: [", "algorithm: {name: 'os:system'}",
         "algorithm:\n  name: fedmpi.algorithms.fedavg:FedAvg\n", "0.1.0", "!!binary x"]))


@st.composite
def perturbation(draw):
    """(where, how, value): a dataset's dtype, shape or values, an attribute, or the file's layout."""
    kind = draw(st.sampled_from(["dtype", "shape", "values", "attr", "attr", "delete", "add", "group", "empty"]))
    if kind == "empty":     # a dataset emptied to no entries (issue 39: found only by the nightly budget)
        return "shape", draw(st.sampled_from(DATASETS)), (0,)
    if kind == "attr":
        return kind, draw(st.sampled_from(ATTRS)), draw(_attr_value())
    where = draw(st.sampled_from(DATASETS))
    if kind == "dtype":
        return kind, where, draw(st.sampled_from(["i1", "i8", "u1", "f2", "f8", "f4", "?", "c8", "S4"]))
    if kind == "shape":
        return kind, where, draw(st.sampled_from([(), (0,), (1,), (609,), (611,), (2, 305), (610, 1), (1 << 20,)]))
    if kind == "values":
        return kind, where, draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e38, 0.0, -0.0, 1e-45, 3e38]))
    if kind == "add":
        return kind, draw(st.sampled_from(["server/extra", "optimizer/extra", "clients/0/extra", "clients/x/a",
                                           "clients/99/c_i", "extra", "participation/extra"])), None
    return kind, where, None


def perturb(path, kind, where, value):
    """Applies one perturbation to a checkpoint and recomputes its checksum as fedmpi.io.checkpoint does,
    so that only the content checks stand between the file and a resume."""
    with h5py.File(path, "r+") as f:
        if kind == "attr":
            f.attrs[where] = value
        elif kind == "add":
            f.create_dataset(where, data=np.zeros(3, np.float32))
        elif where in f:
            old = f[where][()]
            del f[where]
            if kind == "dtype":
                f.create_dataset(where, data=np.asarray(old).astype(value))
            elif kind == "shape":
                f.create_dataset(where, data=np.resize(np.asarray(old), value))
            elif kind == "values":
                new = np.array(old, copy=True)
                new.reshape(-1)[:: max(1, new.size // 3)] = value
                f.create_dataset(where, data=new)
            elif kind == "group":
                f.create_group(where)
        f.attrs["checksum"] = checksum_of(f)


@examples(75)
@given(changes=st.lists(perturbation(), min_size=1, max_size=2), rounds=st.sampled_from(["2", "3"]))
@example(changes=[("dtype", "global", "i1")], rounds="2")
@example(changes=[("shape", "clients/0/c_i", (609,))], rounds="2")
@example(changes=[("attr", "wall_s", "x")], rounds="2")                 # issue 29 finding 3's string wall_s
@example(changes=[("shape", "global", ())], rounds="2")                 # ... and its scalar /global
def test_perturbed_checkpoints_resume_or_are_refused(work, changes, rounds):
    case = Case(work, "stateful")
    ckpt = case.out / "ckpt" / "ckpt-1.h5"
    for change in changes:
        try:
            perturb(ckpt, *change)
        except (TypeError, ValueError, OSError):      # h5py cannot store that value: nothing to test
            pass
    case.before = snapshot(case.out)
    path = case.config(yaml_text(tiny(case.out, **STATEFUL), {}))
    case.check(cli("run", path, "--resume", f"rounds={rounds}"), changes)


# --- a few in a real process ----------------------------------------------------------------------------------

SUBPROCESS_LIMIT_S = 120
SUBPROCESS_ADDRESS_SPACE = 16 << 30     # torch maps ~3 GB of address space when it is imported


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_ADDRESS_SPACE, resource.RLIM_INFINITY))


@examples(3)
@given(entries=config_entries(REAL_FIELDS, max_keys=4), flag=st.sampled_from([["--dry-run"], ["--overwrite"]]))
def test_a_generated_config_in_a_real_process(work, entries, flag):
    case = Case(work)
    path = case.config(yaml_text(tiny(case.out), entries))
    proc = subprocess.run([sys.executable, "-m", "fedmpi", "run", str(path), *flag], capture_output=True, text=True,
                          cwd=case.dir, timeout=SUBPROCESS_LIMIT_S, preexec_fn=_limit_memory,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, errors="replace")
    diverged = proc.returncode == 1 and run_status(case.out) == "diverged"
    assert proc.returncode in ((0, 1, 2) if diverged else (0, 2)), (entries, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if proc.returncode == 2:
        assert snapshot(case.out) == case.before
    release_claims()


def test_the_hostile_scalars_are_each_one_yaml_line():
    assert all("\n" not in s for s in HOSTILE_SCALARS)
    assert hostile() is not None


# --- issue 29's findings 6 and 7, one case each (the generators find the first kind too) -------------------

CIFAR_UNINITIALISED = (  # a 4 x 3072 uint8 array from numpy's reconstructor with no state: its memory never set
    b"(dp0\nS'data'\np1\ncnumpy.core.multiarray\n_reconstruct\np2\n(cnumpy\nndarray\np3\n(I4\nI3072\ntp4\nS'B'\n"
    b"p5\ntp6\nRp7\nsS'labels'\np8\n(lp9\nI0\naI1\naI2\naI3\nas.")


def _leaf_case(case, kind, x, y):
    root = case.dir / "leaf"
    write_leaf(root, kind, users_train=(4, 3), users_test=(2, 2), files=1)
    (root / "train" / "z.json").write_text(json.dumps({"users": ["u"], "num_samples": [len(y)],
                                                       "user_data": {"u": {"x": x, "y": y}}}))
    return {"data": {"name": kind, "root": quoted(str(root))}, "model": {"name": "lr" if kind == "femnist" else "lstm"},
            "partition": {"clients": "2", "scheme": "iid"}}


def _cifar_case(case):
    root = case.dir / "cifar"
    write_cifar(root, "cifar10", n_train=20, n_test=10)
    (root / "cifar-10-batches-py" / "data_batch_1").write_bytes(CIFAR_UNINITIALISED)
    return {"data": {"name": "cifar10", "root": quoted(str(root))}, "partition": {"clients": "2", "scheme": "iid"}}


# name: (sections of the tiny run, or a function of the case giving them; arguments). Each must exit 2 with
# nothing changed; before the fixes each ended otherwise (a traceback, exit 1, or 0 having accepted it).
FINDINGS = {
    "a YAML tag with bad content (!!int abc)": ({"rounds": "!!int abc"}, ["--dry-run"]),
    "an integer of 4,301 digits": ({"rounds": "9" * 4301}, ["--dry-run"]),
    "a control character in an override": ({}, ["--dry-run", "rounds=\x01"]),
    "a control character in a config file": ({"seed": "1 # \x01"}, ["--dry-run"]),
    "a NUL in out": ({"out": quoted("o\0x")}, ["--overwrite"]),
    "seed >= 2^64": ({"seed": str(1 << 64)}, ["--overwrite"]),
    "privacy.noise_multiplier 1e300": ({"privacy": {"mechanism": "gaussian", "noise_multiplier": "1e300"}},
                                       ["--overwrite"]),
    "privacy.noise_multiplier 1e-300": ({"privacy": {"mechanism": "gaussian", "noise_multiplier": "1e-300"}},
                                        ["--overwrite"]),
    "runtime.client_state_memory of 400 digits": ({"runtime": {"threads": "1", "client_state_memory": "'" + "9" * 400
                                                               + "GB'"}}, ["--overwrite"]),
    "a LEAF Shakespeare string with a lone surrogate": (
        lambda case: _leaf_case(case, "shakespeare", ["\ud800" + "a" * 79, "b" * 80], ["a", "b"]), ["--overwrite"]),
    "JSON booleans among LEAF pixels": (
        lambda case: _leaf_case(case, "femnist", [[True] + [0.5] * 783, [0.5] * 784], [1, 2]), ["--overwrite"]),
    "an uninitialised CIFAR array": (_cifar_case, ["--overwrite"]),
    "client.lr_schedule.gamma with constant": ({"client": {"batch_size": "10",
                                                           "lr_schedule": {"name": "constant", "gamma": "0.5"}}},
                                               ["--dry-run"]),
    "server.momentum with sgd": ({"server": {"clients_per_round": "2", "momentum": "0.5"}}, ["--dry-run"]),
    "cosine min_lr above lr": ({"client": {"batch_size": "10", "lr": "0.05",
                                           "lr_schedule": {"name": "cosine", "min_lr": "0.5"}}}, ["--dry-run"]),
}


@pytest.mark.parametrize("name", list(FINDINGS))
def test_finding_exits_2_without_a_traceback(work, name):
    sections, args = FINDINGS[name]
    case = Case(work)
    sections = sections(case) if callable(sections) else sections
    path = case.config(yaml_text(tiny(case.out, **sections), {}))
    outcome = cli("run", path, *args)
    assert outcome.problems((2,)) == [] and outcome.code == 2, (outcome.code, outcome.err[-2000:], outcome.crash)
    assert snapshot(case.out) == case.before


def test_the_bounds_trip():
    """The per-example bounds are real: a sleep past the time bound and an allocation past the address-space
    bound both end the example."""
    import time

    from fuzz_support import Hung, bounded

    with pytest.raises(Hung), bounded(seconds=0.2):
        time.sleep(5)
    with pytest.raises(MemoryError), bounded(extra=256 << 20):
        bytearray(2 << 30)
