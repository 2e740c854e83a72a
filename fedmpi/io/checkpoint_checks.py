"""What a checkpoint must hold, checked before anything in it is used.

The checksum only proves that a file is what its writer (or whoever recomputed the checksum) meant; these
checks prove that it is what this run can load. Every refusal is a BadCheckpoint (exit 2) naming the
checkpoint, the dataset or attribute, what was expected and what was found.

- Attributes (`check_attrs`): round an integer >= 0 (`resume._check_round` compares it with the file
  name), wall_s a finite number >= 0, config and config_hash strings.
- The stored config (`stored_config`, `config_differences`) is compared as parsed YAML data, never built
  into a Config: building one looks up `algorithm.name`, and a `module:Class` there would be imported (its
  code run) before the comparison could refuse it.
- Before the job starts (`check_stored`, rank 0, no model needed): /global a non-empty float vector, the
  optimizer's moments float vectors, both finite; every dataset numeric.
- Before loading (`server_expectations`, `client_expectations`, `check_entry`, `check_like`, on the rank
  that loads each part): shapes and dtype kinds against what this run's model (dim), its algorithm's
  declared ServerVectors / ClientVectors, its server optimizer (`expected_state`) and its participation
  provider, its upload stages and the rest of its algorithm's server state (a fresh state of theirs as the
  template: no entry emptied, one value where the template has one, floats finite but the algorithm's)
  say they must be.
- Client states (`check_client_ids` on rank 0, `check_client` on each client's host): the groups
  under /clients are exactly the clients /manifest lists, each with the entries it counts, and every id a
  client of this run; each declared client vector (Ditto's v, APFL's v, v̄ and alpha, the personal entries
  of FedPer, FedRep and LG-FedAvg, IFCA's cluster choice, SCAFFOLD's c_i, any ClientVectors) has its shape
  and dtype, finite values and, where declared, values within its bounds; on a resume every other float
  entry is finite too.
"""

from __future__ import annotations

import math
import numbers

import h5py
import numpy as np

from fedmpi.algorithms.state import ClientVectors, ServerVectors, declared_bounds, declared_specs
from fedmpi.config import yamlio
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.io.checkpoint import MANIFEST

# Dtype kinds that may stand for one another: a float entry must be float (an int8 /global is garbage, not a
# model), an integer counter any integer, a flag bool or integer.
KINDS = {"f": "f", "i": "iu", "u": "iu", "b": "biu"}
KIND_NAMES = {"f": "float", "i": "integer", "u": "integer", "b": "bool"}


class BadCheckpoint(InputError):
    """A readable checkpoint (its checksum holds) whose contents are not what this run must load: exit 2."""


# -- attributes and the stored config ----------------------------------------------------------------

def check_attrs(path, attrs):
    """The root attributes a resume or a fork uses, by type (a string wall_s, say, is refused here; a missing
    round is the caller's: it makes the file damaged)."""
    round_ = attrs.get("round")
    if round_ is not None and not (isinstance(round_, numbers.Integral) and not isinstance(round_, (bool, np.bool_))
                                   and round_ >= 0):
        raise BadCheckpoint(f"checkpoint {path}: attribute round is {_show(round_)}; expected an integer >= 0")
    wall = attrs.get("wall_s")
    real = isinstance(wall, numbers.Real) and not isinstance(wall, (bool, np.bool_))
    if not (real and math.isfinite(float(wall)) and float(wall) >= 0):
        raise BadCheckpoint(f"checkpoint {path}: attribute wall_s is {_show(wall)}; expected a finite number of "
                            f"seconds >= 0")
    for name in ("config", "config_hash"):
        if not isinstance(attrs.get(name), str):
            raise BadCheckpoint(f"checkpoint {path}: attribute {name} is {_show(attrs.get(name))}; expected text")


def stored_config(path, attrs) -> dict:
    """The checkpoint's stored config as parsed YAML data (safe constructors only: nothing is imported)."""
    text = attrs.get("config")
    if not isinstance(text, str):
        raise BadCheckpoint(f"checkpoint {path}: attribute config is {_show(text)}; expected the run's config as "
                            f"YAML text")
    try:
        data = yamlio.load(text, f"checkpoint {path}: stored config")
    except ConfigError as e:
        raise InputError(f"checkpoint {path}: its stored config cannot be read ({e})") from None
    if not isinstance(data, dict):
        raise InputError(f"checkpoint {path}: its stored config is not a mapping of keys")
    return data


def config_differences(stored: dict, cfg, ignore=()) -> list:
    """Dotted keys whose values differ between the stored config data and `cfg`, keys (or sections) in
    `ignore` left out. `cfg` goes through the same YAML round trip as the stored text, so both sides are
    plain data of the same form."""
    now = yamlio.load(cfg.to_yaml(), "this run's config")
    fs, fc = flat(stored), flat(now)
    return [k for k in sorted(set(fs) | set(fc))
            if k.split(".")[0] not in ignore and k not in ignore and fs.get(k) != fc.get(k)]


def flat(d, prefix=""):
    """{dotted key: value} of a nested mapping."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flat(v, key) if isinstance(v, dict) else {key: v})
    return out


# -- datasets ----------------------------------------------------------------------------------------

def check_stored(path, f, finite=True, dim=None):
    """Rank 0, before the job builds anything: what needs no model. /global a non-empty float vector, each
    /optimizer entry a float vector, both finite (unless `finite` is False: runtime.on_nonfinite continue
    keeps non-finite models); every dataset numeric (the writer stores nothing else). `dim`, where known
    (run.h5 records the model's length), is /global's length."""
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.dtype.kind not in "biuf":
            raise BadCheckpoint(f"checkpoint {path}: /{name} has dtype {obj.dtype}; a checkpoint holds numbers only")

    f.visititems(visit)
    _check_layout(path, f)
    glob = f.get("global")
    if not isinstance(glob, h5py.Dataset):
        raise BadCheckpoint(f"checkpoint {path}: /global is not a dataset; expected the global model vector")
    check_entry(path, "global", glob[()], None if dim is None else (dim,), np.float32, finite, "the global model")
    opt = f.get("optimizer")
    if opt is not None:
        for name, ds in _datasets(path, "optimizer", opt):
            check_entry(path, f"optimizer/{name}", ds[()], None, np.float64, finite, "a server-optimizer moment")


def _check_layout(path, f):
    """/global a dataset, every other top-level entry a group of datasets (/clients a group of such groups)."""
    for name, obj in f.items():
        if name == "global":
            continue
        if name == "clients" and isinstance(obj, h5py.Group):
            for cid, group in obj.items():
                if not cid.isdigit():
                    raise BadCheckpoint(f"checkpoint {path}: /clients/{cid}: expected groups named by client id")
                list(_datasets(path, f"clients/{cid}", group))
        else:
            list(_datasets(path, name, obj))


def _datasets(path, where, group):
    if not isinstance(group, h5py.Group):
        raise BadCheckpoint(f"checkpoint {path}: /{where} is not a group")
    for name, obj in group.items():
        if not isinstance(obj, h5py.Dataset):
            raise BadCheckpoint(f"checkpoint {path}: /{where}/{name} is not a dataset")
        yield name, obj


def check_entry(path, where, a, shape, dtype, finite, what):
    """One entry against (shape, dtype) (shape None: any non-empty vector); `a` an array or an h5py
    dataset (only its shape and dtype are read unless `finite`)."""
    dtype = np.dtype(dtype)
    ok_shape = (len(a.shape) == 1 and a.shape[0] > 0) if shape is None else tuple(a.shape) == tuple(shape)
    if not ok_shape or a.dtype.kind not in KINDS[dtype.kind]:
        want = "a non-empty vector" if shape is None else f"shape {tuple(shape)}"
        raise BadCheckpoint(f"checkpoint {path}: /{where} ({what}) has shape {tuple(a.shape)} and dtype {a.dtype}; "
                            f"expected {want} of {KIND_NAMES[dtype.kind]} values ({dtype})")
    if finite:
        values = np.asarray(a[()])
        bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
        if bad.size:
            raise BadCheckpoint(f"checkpoint {path}: /{where} ({what}) has {bad.size} non-finite values (the first "
                                f"at index {int(bad[0])}: {values.reshape(-1)[bad[0]]}); expected finite numbers")


def check_like(path, where, stored: dict, template: dict, what, finite=True):
    """A state whose declaration is its fresh value (participation, upload stages, the algorithm's server
    state): each stored entry the template names has the template's number of dimensions and dtype kind;
    its shape where the template holds one value (a clock, a counter), at least one value where the
    template holds any (lengths may differ: e.g. the clients in flight; an emptied dataset is refused here,
    not met as an IndexError when loaded); and, with `finite`, finite floats."""
    for name, fresh in template.items():
        if name not in stored:
            continue
        a, fresh = stored[name], np.asarray(fresh)
        expected = f"{fresh.ndim}-d {KIND_NAMES.get(fresh.dtype.kind, fresh.dtype)} values ({fresh.dtype})"
        expected += f", shape {fresh.shape}" if fresh.size == 1 else ", at least one value" if fresh.size else ""
        if (a.ndim != fresh.ndim or a.dtype.kind not in KINDS.get(fresh.dtype.kind, fresh.dtype.kind)
                or (fresh.size == 1 and a.shape != fresh.shape) or (fresh.size and not a.size)):
            raise BadCheckpoint(f"checkpoint {path}: /{where}/{name} ({what}) has shape {tuple(a.shape)} and dtype "
                                f"{a.dtype}; expected {expected}, as this run's {what} holds")
        if finite and a.dtype.kind == "f":
            check_entry(path, f"{where}/{name}", a, a.shape, a.dtype, True, what)


def server_expectations(exp) -> dict:
    """{dataset: (shape, dtype, finite-required, what)} of what rank 0 loads for `exp`'s server."""
    finite = exp.cfg.runtime.on_nonfinite != "continue"
    server = exp.server
    specs = {"global": ((exp.flat.dim,), np.float32, finite, f"the global model of {exp.flat.dim} entries")}
    for name, (shape, dtype) in declared_specs(server.algo, ServerVectors).items():
        specs[f"server/{name}"] = (shape, dtype, finite, f"algorithm state {name}")
    for name, (shape, dtype) in server.optimizer.expected_state().items():
        specs[f"optimizer/{name}"] = (shape, dtype, finite, f"server.optimizer {exp.cfg.server.optimizer}'s {name}")
    return specs


def client_expectations(exp) -> dict:
    """{name: (shape or None, dtype)} of the client vectors `exp`'s algorithm declares."""
    return declared_specs(exp.algo, ClientVectors)


def client_bounds(exp) -> dict:
    """{name: (low, high, whole)} of the client vectors whose values `exp`'s algorithm declares."""
    return declared_bounds(exp.algo)


def check_client_ids(path, f, num_clients):
    """Rank 0: the /clients groups against /manifest (the ids the writer stored state for, and each one's
    number of entries), every id one of this run's `num_clients` clients: a group added for a client that
    does not exist, one added or removed beside the manifest, or an entry added or removed, is refused."""
    clients, manifest = f.get("clients"), f.get(MANIFEST)
    if not isinstance(manifest, h5py.Group) or set(manifest) != {"clients", "entries"}:
        raise BadCheckpoint(f"checkpoint {path}: /{MANIFEST} is missing or incomplete; expected /{MANIFEST}/clients "
                            f"and /{MANIFEST}/entries (the clients stored under /clients)")
    ids, counts = manifest["clients"][()], manifest["entries"][()]
    _check_manifest_lists(path, ids, counts, 0 if clients is None else len(clients))
    beyond = ids[(ids < 0) | (ids >= num_clients)]
    if beyond.size:
        raise BadCheckpoint(f"checkpoint {path}: /{MANIFEST}/clients names client {int(beyond[0])}; expected ids of "
                            f"this run's {num_clients} clients (0..{num_clients - 1})")
    odd = [] if clients is None else [cid for cid in clients if not cid.isdigit()]
    if odd:
        raise BadCheckpoint(f"checkpoint {path}: /clients/{odd[0]}: expected groups named by client id")
    stored = {} if clients is None else {int(cid): len(group) for cid, group in clients.items()}
    expected = dict(zip(ids.tolist(), counts.tolist()))
    for cid in sorted(set(stored) | set(expected)):
        if cid >= num_clients:
            raise BadCheckpoint(f"checkpoint {path}: /clients/{cid} is the state of a client that does not exist in "
                                f"this run; expected client ids 0..{num_clients - 1}")
        if stored.get(cid) != expected.get(cid):
            found = "is missing" if cid not in stored else f"has {stored[cid]} entries"
            want = "no group" if cid not in expected else f"{expected[cid]} entries"
            raise BadCheckpoint(f"checkpoint {path}: /clients/{cid} {found}; expected {want}, as /{MANIFEST} lists")


def _check_manifest_lists(path, ids, counts, groups):
    def refuse(where, a, rule):
        raise BadCheckpoint(f"checkpoint {path}: /{MANIFEST}/{where} has shape {a.shape} and dtype {a.dtype}; "
                            f"expected {rule}")

    if not (ids.ndim == 1 and ids.dtype.kind in "iu" and np.all(np.diff(ids) > 0)):
        refuse("clients", ids, "increasing integer client ids")
    if not (counts.ndim == 1 and counts.dtype.kind in "iu" and np.all(counts > 0)):
        refuse("entries", counts, "positive integer counts of entries")
    if ids.shape != counts.shape:
        # The list that disagrees with the groups stored under /clients is the one at fault.
        where, a = ("clients", ids) if len(ids) != groups else ("entries", counts)
        refuse(where, a, f"one value per client group under /clients ({groups})")


def check_client(path, cid, group, specs, bounds=None, finite=True, every_float=False):
    """One client's stored state: declared vectors as declared (shape, dtype, finite values unless not
    `finite`, within their `bounds`), any other entry numeric (and, with `every_float`, finite if float)."""
    for name, ds in _datasets(path, f"clients/{cid}", group):
        where = f"clients/{cid}/{name}"
        if name in specs:
            shape, dtype = specs[name]
            check_entry(path, where, ds, shape, dtype, finite, f"client {cid}'s {name}")
            if name in (bounds or {}):
                _check_bounds(path, where, ds[()], *bounds[name], f"client {cid}'s {name}")
        elif ds.dtype.kind not in "biuf":
            raise BadCheckpoint(f"checkpoint {path}: /{where} has dtype {ds.dtype}; a checkpoint holds numbers only")
        elif every_float and finite and ds.dtype.kind == "f":
            check_entry(path, where, ds, ds.shape, ds.dtype, True, f"client {cid}'s {name}")


def _check_bounds(path, where, values, low, high, whole, what):
    values = np.asarray(values).reshape(-1)
    bad = (values < low if low is not None else False) | (values > high if high is not None else False)
    if whole:
        bad = bad | (values != np.round(values))
    at = np.flatnonzero(bad)
    if at.size:
        span = f"[{low}, {high}]" if low is not None or high is not None else "any value"
        raise BadCheckpoint(f"checkpoint {path}: /{where} ({what}) holds {values[at[0]]} at index {int(at[0])}; "
                            f"expected {'whole numbers' if whole else 'values'} in {span}")


def _show(value):
    text = repr(value.item() if isinstance(value, np.generic) else value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({type(value).__name__})"
