"""Issue 29's fuzz suite, its input files (tests/test_fuzz.py has the configs, overrides, checkpoints and the
issue's findings): LEAF JSON, idx files, CIFAR python batches and availability/speed/bandwidth traces, each
generated from its format, and the same property as there for every example (tests/test_fuzz.py's docstring):
exit 0 or 2, never a traceback, within the example's bounds, and the finished run in `out` unchanged unless
the new run succeeded. Split from tests/test_fuzz.py by topic, at the same budget (fuzz_support.examples)."""

from __future__ import annotations

import json
import os
import pickle
import struct

import numpy as np
import pytest
from dataset_files import write_cifar, write_leaf, write_mnist_family
from fuzz_cases import Case, make_work, tiny
from fuzz_support import SPECIAL_FILES, cli, examples, make_special, mutated, quoted, snapshot, yaml_text
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder to run in with the finished runs `template` and `stateful` (fuzz_cases.make_work), made once."""
    yield from make_work(tmp_path_factory)


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


# --- every input file above, and the config, spec and .npz, as a FIFO or a device --------------------------------

def _special_site(site, case):
    """(argv, the path to make special) of one input site, its other files valid, in the example's folder."""
    root = case.dir / "data"
    data = {"leaf-femnist": ("femnist", "lr"), "leaf-shakespeare": ("shakespeare", "lstm")}
    if site in data:
        kind, model = data[site]
        write_leaf(root, kind, users_train=(4, 3), users_test=(2, 2), files=1)
        path = case.config(yaml_text(tiny(case.out, data={"name": kind, "root": quoted(str(root))},
                                          model={"name": model}, partition={"clients": "2", "scheme": "iid"}), {}))
        return ["run", path, "--overwrite"], root / "train" / "a.json"
    if site == "idx":
        write_mnist_family(root, n_train=20, n_test=10)
        path = case.config(yaml_text(tiny(case.out, data={"name": "mnist", "root": quoted(str(root))}), {}))
        return ["run", path, "--overwrite"], root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    if site == "cifar":
        write_cifar(root, "cifar10", n_train=20, n_test=10)
        path = case.config(yaml_text(tiny(case.out, data={"name": "cifar10", "root": quoted(str(root))}), {}))
        return ["run", path, "--overwrite"], root / "cifar-10-batches-py" / "data_batch_1"
    if site in TRACES:
        trace = case.dir / "trace.csv"
        keys = {"availability": {"availability": "trace", "trace": quoted(str(trace))},
                "speed": {"speed": {"kind": "trace", "trace": quoted(str(trace))}},
                "bandwidth": {"bandwidth": {"kind": "trace", "trace": quoted(str(trace))}}}[site]
        return ["run", case.config(yaml_text(tiny(case.out, clients=keys), {})), "--overwrite"], trace
    if site in ("npz", "npz --dry-run"):
        npz = case.dir / "d.npz"
        path = case.config(yaml_text(tiny(case.out, data={"name": "arrays", "root": quoted(str(npz))}), {}))
        return ["run", path, "--overwrite", *site.split()[1:]], npz
    if site in ("config", "config --dry-run"):
        return ["run", case.dir / "c.yaml", *site.split()[1:]], case.dir / "c.yaml"
    spec = case.dir / "s.yaml"
    return ["sweep", spec, "--dry-run"], spec


SPECIAL_SITES = ("leaf-femnist", "leaf-shakespeare", "idx", "cifar", *TRACES, "npz", "npz --dry-run", "config",
                 "config --dry-run", "sweep spec")


@pytest.mark.parametrize("kind", SPECIAL_FILES)
@pytest.mark.parametrize("site", SPECIAL_SITES)
def test_special_files_are_refused(work, site, kind):
    """H04: every input file of this suite given as a FIFO or a link to /dev/zero or /dev/urandom: exit 2 naming
    it, within the example's bounds (it was read forever, or until memory ran out)."""
    case = Case(work)
    argv, target = _special_site(site, case)
    make_special(target, kind)
    outcome = cli(*argv)
    outcome.check((2,), f"{site} as {kind}")
    assert target.name in outcome.err, outcome.err[-2000:]
    assert snapshot(case.out) == case.before, f"{site} as {kind}: exit 2 changed the old run"
