"""Data sets and models from outside fedmpi (issue 27 parts 1, 2 and 6), one process: the array checks against
hand-made cases, the plug-in lookups and their errors, the `arrays` source on npz, HDF5 and a saved Hugging Face
data set, torchvision's models by name, and a bad plug-in refused by `fedmpi run` before anything is written.
The MPI runs (-n 1 and -n 3, resume) are in tests/test_plugins_mpi.py."""

from __future__ import annotations

import importlib.util
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import write_config
from plugin_package import write_plugin_package

from fedmpi import config
from fedmpi.cli import main
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.models import build_model, check_takes
from fedmpi.data import load_dataset
from fedmpi.data.checked_arrays import dataset_from_mapping

HAS_HF = importlib.util.find_spec("datasets") is not None
needs_hf = pytest.mark.skipif(not HAS_HF, reason="the Hugging Face `datasets` package is not installed "
                                                 "(pip install 'fedmpi[hf]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = write_plugin_package(tmp_path_factory.mktemp("site"))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in [m for m in sys.modules if m == "myfl" or m.startswith("myfl.")]:
        del sys.modules[name]


def _arrays(**changes):
    g = np.random.default_rng(0)
    base = {"x_train": g.normal(size=(6, 2)), "y_train": np.array([0, 1, 2, 0, 1, 2]),
            "x_test": g.normal(size=(3, 2)), "y_test": np.array([2, 1, 0]),
            "client_train": np.array([5, 3, 5, 3, 9, 5]), "client_test": np.array([3, 7, 3])}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def _cfg(**sections):
    base = {"partition": {"clients": 3, "scheme": "natural"}, "server": {"clients_per_round": 1}}
    base.update(sections)
    return config.from_dict(base)


# --- the checks of a mapping of arrays ---------------------------------------------------------------------

def test_client_ids_become_users_in_id_order_with_their_own_test_samples():
    ds = dataset_from_mapping("t", _arrays(), "data.name = 't'")
    assert [u.tolist() for u in ds.users] == [[1, 3], [0, 2, 5], [4]]          # ids 3, 5, 9
    assert [u.tolist() for u in ds.test_users] == [[0, 2], [], []]             # id 7 has no training samples
    assert ds.num_classes == 3 and ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert np.array_equal(ds.x_train, _arrays()["x_train"].astype(np.float32))


def test_integer_inputs_stay_tokens_and_num_classes_is_taken_when_given():
    ds = dataset_from_mapping("t", _arrays(x_train=np.arange(12).reshape(6, 2), x_test=np.ones((3, 2), np.int32),
                                           num_classes=np.array(5), client_train=None, client_test=None), "w")
    assert ds.x_train.dtype == np.int64 and ds.num_classes == 5 and ds.users is None and ds.test_users is None


@pytest.mark.parametrize("given", [4, np.int64(4), np.int32(4), np.array(4), np.array([4])])
def test_num_classes_as_a_scalar_integer_is_taken(given):
    """H-small a: docs/how-to/own-data.md calls num_classes a "scalar integer"; a plain int was refused as "not a numpy
    array"."""
    ds = dataset_from_mapping("t", _arrays(num_classes=given), "data.name = 'my.pkg:fn'")
    assert ds.num_classes == 4


@pytest.mark.parametrize("given", [True, 1, 2.0, "4"])
def test_num_classes_that_is_no_integer_of_at_least_two_is_refused(given):
    with pytest.raises(InputError) as e:
        dataset_from_mapping("t", _arrays(num_classes=given, y_train=np.array([0, 1, 0, 1, 0, 1]),
                                          y_test=np.array([1, 0, 1])), "data.name = 'my.pkg:fn'")
    assert "num_classes" in str(e.value) and e.value.exit_code == 2 and "\n" not in str(e.value)


@pytest.mark.parametrize("changes, words", [
    ({"y_test": None}, "no y_test"),
    ({"x_train": [[0.0, 1.0]] * 6}, "x_train is a list, not a numpy array"),
    ({"x_train": np.full((6, 2), np.nan)}, "x_train holds NaN or infinite values"),
    ({"x_test": np.array([[1e39, 0], [0, 0], [0, 0]])}, "x_test holds NaN or infinite values as float32"),
    ({"x_train": np.zeros(6)}, "x_train has shape (6,)"),
    ({"x_train": np.zeros((6, 0)), "x_test": np.zeros((3, 0))}, "x_train has shape (6, 0)"),
    ({"x_train": np.array([["a", "b"]] * 6)}, "inputs must be floating point"),
    ({"x_test": np.zeros((3, 4))}, "samples of one shape"),
    ({"y_train": np.array([0.0, 1, 2, 0, 1, 2])}, "labels must be one integer per sample"),
    ({"y_train": np.array([0, 1, 2, 0, 1, -1])}, "labels must be integers >= 0"),
    ({"y_train": np.array([0, 1, 2, 0, 1, 7]), "num_classes": np.array(3)}, "labels must lie in 0..2"),
    ({"y_test": np.array([0, 1])}, "x_test has 3 samples but y_test 2 labels"),
    ({"client_train": np.array([1, 2, 3])}, "client_train has 3 client ids but y_train has 6 samples"),
    ({"client_test": np.array([0.5, 1.0, 2.0])}, "client ids must be one integer per sample"),
    ({"client_train": None}, "client_test without client_train"),
])
def test_bad_arrays_are_refused_naming_what_is_wrong(changes, words):
    with pytest.raises(InputError) as e:
        dataset_from_mapping("t", _arrays(**changes), "data.name = 'my.pkg:fn'")
    assert str(e.value).startswith("data.name = 'my.pkg:fn': ") and words in str(e.value), str(e.value)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


# --- data set plug-ins -------------------------------------------------------------------------------------

def test_entry_point_and_path_give_the_same_natural_clients(site):
    by_path = load_dataset(_cfg(data={"name": "myfl.data:blobs", "kwargs": {"n_clients": 3}}))
    by_entry = load_dataset(_cfg(data={"name": "blobs", "kwargs": {"n_clients": 3}}))
    assert np.array_equal(by_path.x_train, by_entry.x_train) and len(by_path.users) == 3
    assert [len(u) for u in by_path.users] == [30, 30, 30] and [len(u) for u in by_path.test_users] == [10] * 3


def test_a_plugin_gets_the_data_keys_and_its_kwargs_as_its_signature_takes(site):
    with pytest.raises(ConfigError) as e:
        load_dataset(_cfg(data={"name": "myfl.data:everything", "kwargs": {"extra": 1}}))
    assert "'alpha'" in str(e.value) and "'extra'" in str(e.value) and "'root'" in str(e.value)
    assert "'kwargs'" not in str(e.value) and "'name'" not in str(e.value)


@pytest.mark.parametrize("name, words", [
    ("nowhere_pkg_x.data:load", ["no module 'nowhere_pkg_x.data' on the import path", "PYTHONPATH",
                                 "pip install"]),
    ("myfl.missing:fn", ["no module 'myfl.missing' on the import path", "PYTHONPATH"]),
    ("needsdep_x.data:load", ["module 'needsdep_x.data' imports 'absent_dependency_x'", "pip install"]),
])
def test_a_plugin_module_not_found_names_the_import_path_and_what_to_do(site, tmp_path, monkeypatch, name, words):
    """Smaller item b: a plug-in's ModuleNotFoundError said only "No module named ..."; the line names the
    import path and PYTHONPATH / pip install, and tells a missing plug-in from a missing dependency of it."""
    (tmp_path / "needsdep_x").mkdir()
    (tmp_path / "needsdep_x" / "__init__.py").write_text("")
    (tmp_path / "needsdep_x" / "data.py").write_text("import absent_dependency_x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        load_dataset(_cfg(data={"name": name}))
    text = str(e.value)
    assert text.startswith("data.name: cannot load ") and "\n" not in text, text
    assert all(w in text for w in words), text


@pytest.mark.parametrize("name, words", [
    ("myfl.missing:fn", "data.name: cannot load 'myfl.missing:fn': ModuleNotFoundError"),
    ("myfl.data:nothing", "AttributeError"),
    ("myfl.broken:fn", "importing module 'myfl.broken' failed: RuntimeError: broken at import"),
    ("myfl.exits:fn", "module 'myfl.exits' called sys.exit(4) while being imported"),
    ("myfl.data:raises", "the function raised ValueError: no such folder, says the plug-in"),
    ("myfl.data:quits", "the function called sys.exit(3)"),
    ("myfl.data:NOT_A_FUNCTION", "names a int, not a function"),
])
def test_plugin_data_sets_that_cannot_load_are_config_errors(site, name, words):
    with pytest.raises(ConfigError) as e:
        load_dataset(_cfg(data={"name": name}))
    assert words in str(e.value) and "data.name" in str(e.value), str(e.value)


@pytest.mark.parametrize("data, words", [
    ({"name": "a:b:c"}, "data.name = 'a:b:c': not a valid plug-in name"),
    ({"name": "..x:f"}, "not a valid plug-in name"),
    ({"name": "mnist6k"}, "data.name = 'mnist6k': unknown (did you mean 'mnist5k'?)"),
    ({"name": "mnist5k", "kwargs": {"a": 1}}, "data.kwargs = {'a': 1}: passes keyword arguments to a plug-in"),
    ({"name": "x.y:f", "kwargs": {"not an id": 1}}, "data.kwargs"),
    ({"name": "arrays", "columns": {"z": "img"}}, "data.columns.z: unknown role"),
    ({"name": "mnist5k", "columns": {"x": "img"}}, "data.columns = {'x': 'img'}: is not used by data.name"),
    ({"name": "x.y:f", "kwargs": {"root": "/d"}}, None),    # the clash is found when the plug-in is called
])
def test_data_names_and_mappings_are_checked_with_the_config(data, words):
    if words is None:
        from fedmpi.data.plugins import offered_keys

        with pytest.raises(ConfigError, match=r"data.kwargs.root: is a key of the data section itself"):
            offered_keys(config.from_dict({"data": data}).data)
        return
    with pytest.raises(ConfigError) as e:
        config.from_dict({"data": data})
    assert words in str(e.value), str(e.value)


def test_new_keys_at_their_defaults_leave_the_hash_as_it_was():
    plain = config.from_dict({"seed": 3})
    assert plain.hash() == plain.hash(ignore=config.RUNTIME_KEYS)
    d = plain.to_dict()
    assert d["data"]["kwargs"] == {} and d["model"]["kwargs"] == {} and d["data"]["columns"] == {}
    with_kwargs = config.from_dict({"seed": 3, "data": {"name": "x.y:f", "kwargs": {"a": 1}}})
    assert with_kwargs.hash() != config.from_dict({"seed": 3, "data": {"name": "x.y:f"}}).hash()
    import yaml
    for section, key in (("data", "kwargs"), ("data", "columns"), ("model", "kwargs")):
        del d[section][key]
    for key in config.RUNTIME_KEYS:
        d.pop(key, None)
    d["server"].pop("trains_clients")
    for dotted in config.HASH_OPTIONAL:
        *parents, leaf = dotted.split(".")
        node = d
        for part in parents:
            node = node[part]
        node.pop(leaf, None)
    import hashlib
    assert plain.hash() == hashlib.sha256(yaml.safe_dump(d, sort_keys=True).encode()).hexdigest()[:16]


# --- the arrays source -------------------------------------------------------------------------------------

def _write_npz(path, arrays):
    np.savez(path, **arrays)
    return path


def test_npz_and_hdf5_read_the_same_data_set(tmp_path):
    arrays = _arrays()
    npz = _write_npz(tmp_path / "d.npz", arrays)
    h5 = tmp_path / "d.h5"
    with h5py.File(h5, "w") as f:
        for k, v in arrays.items():
            f[k] = v
    a = load_dataset(_cfg(data={"name": "arrays", "root": str(npz)}))
    b = load_dataset(_cfg(data={"name": "arrays", "root": str(h5)}))
    for ds in (a, b):
        assert np.array_equal(ds.x_train, arrays["x_train"].astype(np.float32))
        assert [u.tolist() for u in ds.users] == [[1, 3], [0, 2, 5], [4]]


def test_arrays_source_refuses_pickles_and_unknown_files(tmp_path):
    bad = _write_npz(tmp_path / "obj.npz", _arrays(y_train=np.array([0, 1, 2, 0, 1, None], dtype=object)))
    with pytest.raises(InputError, match="Object arrays cannot be loaded when allow_pickle=False"):
        load_dataset(_cfg(data={"name": "arrays", "root": str(bad)}))
    (tmp_path / "d.csv").write_text("1,2\n")
    with pytest.raises(InputError, match="not an .npz or HDF5 file"):
        load_dataset(_cfg(data={"name": "arrays", "root": str(tmp_path / "d.csv")}))
    with pytest.raises(InputError, match="no such file or folder"):
        load_dataset(_cfg(data={"name": "arrays", "root": str(tmp_path / "none.npz")}))
    nan = _write_npz(tmp_path / "nan.npz", _arrays(x_test=np.full((3, 2), np.inf)))
    with pytest.raises(InputError, match=r"data.root = .*nan.npz': x_test holds NaN or infinite"):
        load_dataset(_cfg(data={"name": "arrays", "root": str(nan)}))


@needs_hf
def test_a_saved_hugging_face_data_set_reads_like_the_npz(tmp_path):
    import datasets

    arrays = _arrays()
    split = {s: datasets.Dataset.from_dict({"feat": arrays[f"x_{s}"].astype(np.float32).tolist(),
                                            "label": arrays[f"y_{s}"], "user": arrays[f"client_{s}"]})
             for s in ("train", "test")}
    datasets.DatasetDict(split).save_to_disk(str(tmp_path / "hf"))
    columns = {"x": "feat", "y": "label", "client": "user"}
    hf = load_dataset(_cfg(data={"name": "arrays", "root": str(tmp_path / "hf"), "columns": columns}))
    npz = load_dataset(_cfg(data={"name": "arrays", "root": str(_write_npz(tmp_path / "d.npz", arrays))}))
    for a, b in ((hf.x_train, npz.x_train), (hf.y_test, npz.y_test)):
        assert np.array_equal(a, b)
    assert [u.tolist() for u in hf.users] == [u.tolist() for u in npz.users]
    assert [u.tolist() for u in hf.test_users] == [u.tolist() for u in npz.test_users]
    with pytest.raises(ConfigError, match=r"data.columns.x = 'x': the train split .* has no such column"):
        load_dataset(_cfg(data={"name": "arrays", "root": str(tmp_path / "hf")}))


@needs_hf
def test_hugging_face_images_become_float_channels_first(tmp_path):
    import datasets

    pixels = np.arange(2 * 4 * 5, dtype=np.uint8).reshape(2, 4, 5)
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    split = {s: datasets.Dataset.from_dict({"image": list(pixels), "label": [0, 1]}, features=feats)
             for s in ("train", "test")}
    datasets.DatasetDict(split).save_to_disk(str(tmp_path / "img"))
    ds = load_dataset(_cfg(data={"name": "arrays", "root": str(tmp_path / "img"), "columns": {"x": "image",
                                                                                             "y": "label"}},
                           partition={"clients": 1, "scheme": "iid"}))
    assert ds.x_train.shape == (2, 1, 4, 5) and ds.x_train.dtype == np.float32
    assert np.allclose(ds.x_train[:, 0], pixels / 255.0)


# --- model plug-ins ----------------------------------------------------------------------------------------

def _model_cfg(name, **kwargs):
    return config.from_dict({"model": {"name": name, "kwargs": kwargs}}).model


def test_plugin_models_are_told_the_shape_and_classes_their_signature_names(site):
    torch.manual_seed(0)
    net = build_model(_model_cfg("myfl.nets:TwoLayer", width=5), (2, 4), 7)
    assert net.net[1].in_features == 8 and net.net[1].out_features == 5 and net.net[3].out_features == 7
    lin = build_model(_model_cfg("myfl.nets:linear", features=3), (3,), 4)
    assert (lin.in_features, lin.out_features) == (3, 4)
    assert isinstance(build_model(_model_cfg("twolayer"), (8,), 3), type(net))      # the entry point


@pytest.mark.parametrize("name, words", [
    ("myfl.nets:Raising", "model.name = 'myfl.nets:Raising': building it with model.kwargs {} raised RuntimeError"),
    ("myfl.nets:not_a_module", "returned a str, not a torch.nn.Module"),
    ("myfl.nets:IntegerParameters", "parameter 'w' has dtype torch.int64; every parameter must be floating"),
    ("myfl.nope:Net", "model.name: cannot load 'myfl.nope:Net': ModuleNotFoundError"),
    ("myfl.broken:Net", "importing module 'myfl.broken' failed"),
    ("torchvision:resnet19", "torchvision has no classification model 'resnet19' (did you mean "),
])
def test_plugin_models_that_cannot_be_built_are_config_errors(site, name, words):
    with pytest.raises(ConfigError) as e:
        build_model(_model_cfg(name), (8,), 3)
    assert words in str(e.value), str(e.value)


def test_a_plugin_model_whose_forward_fails_on_the_data_is_refused(site):
    cfg = config.from_dict({"data": {"name": "blobs"}, "model": {"name": "myfl.nets:WrongWidth"},
                            "partition": {"clients": 4, "scheme": "natural"}, "server": {"clients_per_round": 1}})
    ds = load_dataset(cfg)
    model = build_model(cfg.model, ds.input_shape, ds.num_classes)
    with pytest.raises(ConfigError, match=r"model.name = 'myfl.nets:WrongWidth' cannot take data.name = 'blobs'"):
        check_takes(model, cfg.model.name, cfg.data.name, ds.x_train, ds.num_classes)
    with pytest.raises(ConfigError, match=r"one sample gives outputs of shape \(1, 3\), not \(1, 5\)"):
        check_takes(model.lin.__class__(8, 3), cfg.model.name, cfg.data.name, ds.x_train, 5)


@pytest.mark.parametrize("model, words", [
    ({"name": "mlp", "kwargs": {"width": 3}}, "model.kwargs = {'width': 3}: passes constructor arguments"),
    ({"name": "x:y:z"}, "model.name = 'x:y:z': not a valid plug-in name"),
    ({"name": "resnet81"}, "model.name = 'resnet81': unknown (did you mean 'resnet18'?)"),
    ({"name": "x.y:Net", "projection": 4}, None),
])
def test_model_names_are_checked_with_the_config(model, words):
    if words is None:       # projection belongs to two built-in models only, refused when building
        with pytest.raises(ConfigError, match="only simple_cnn and resnet18 have a projection head"):
            build_model(config.from_dict({"model": model}).model, (8,), 3)
        return
    with pytest.raises(ConfigError) as e:
        config.from_dict({"model": model})
    assert words in str(e.value), str(e.value)


def test_a_torchvision_model_runs_by_name(tmp_path):
    """torchvision:mobilenet_v3_small (cheaper than resnet18 on two cores), 3 x 32 x 32 random images from an
    .npz, one round of two steps; num_classes passed through model.kwargs."""
    g = np.random.default_rng(1)
    npz = _write_npz(tmp_path / "img.npz", {"x_train": g.normal(size=(24, 3, 32, 32)).astype(np.float32),
                                            "y_train": g.integers(0, 10, 24), "y_test": g.integers(0, 10, 8),
                                            "x_test": g.normal(size=(8, 3, 32, 32)).astype(np.float32)})
    cfg = write_config(tmp_path / "tv.yaml", {
        "rounds": 1, "out": str(tmp_path / "run"), "data": {"name": "arrays", "root": str(npz)},
        "partition": {"clients": 2, "scheme": "iid"}, "server": {"clients_per_round": 2},
        "model": {"name": "torchvision:mobilenet_v3_small", "kwargs": {"num_classes": 10}},
        "client": {"batch_size": 6, "steps": 2}, "runtime": {"threads": 1, "progress": "off"}})
    assert main(["run", str(cfg)]) == 0
    with h5py.File(tmp_path / "run" / "run.h5", "r") as f:
        assert np.isfinite(f["metrics/test_loss"][()]).all() and len(f["model/global"][()]) > 1_000_000


def test_fedmpi_run_refuses_a_bad_plugin_before_writing_anything(site, tmp_path, capsys):
    """A good run first; then bad plug-ins with --overwrite: exit 2, one line naming the key, the old run.h5
    untouched and nothing new beside it."""
    def config_file(model="twolayer", **data):
        return write_config(tmp_path / "c.yaml", {
            "rounds": 1, "out": str(tmp_path / "out"), "data": {"name": "blobs", **data},
            "partition": {"clients": 4, "scheme": "natural"}, "server": {"clients_per_round": 2},
            "model": {"name": model}, "runtime": {"threads": 1, "progress": "off"}})

    assert main(["run", str(config_file())]) == 0
    before = (tmp_path / "out" / "run.h5").read_bytes()
    listing = sorted(p.name for p in (tmp_path / "out").iterdir())
    capsys.readouterr()
    for data, words in (({"name": "myfl.data:raises"}, "data.name = 'myfl.data:raises': the function raised"),
                        ({"kwargs": {"n_clients": 5}}, "partition.clients = 4: data.name = 'blobs' has 5 natural"),
                        ({"kwargs": {"dim": 0}}, "data.name = 'blobs': x_train has shape (120, 0)"),
                        ({"model": "myfl.nets:WrongWidth"}, "model.name = 'myfl.nets:WrongWidth' cannot take")):
        assert main(["run", str(config_file(**data)), "--overwrite"]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedmpi: ")]
        assert len(err) == 1 and words in err[0], err
        assert (tmp_path / "out" / "run.h5").read_bytes() == before
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == listing


def test_dry_run_takes_a_plugin_model_that_cannot_be_sized_on_meta(site, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml", {
        "rounds": 1, "out": str(tmp_path / "out"), "data": {"name": "blobs"},
        "partition": {"clients": 4, "scheme": "natural"}, "server": {"clients_per_round": 2},
        "model": {"name": "myfl.nets:MetaUnfriendly"}, "runtime": {"threads": 1, "progress": "off"}})
    assert main(["run", str(cfg), "--dry-run"]) == 0
    assert main(["run", str(cfg), "--dry-run", "model.name=myfl.nets:Nope"]) == 2
    assert "model.name: cannot load 'myfl.nets:Nope': AttributeError" in capsys.readouterr().err
