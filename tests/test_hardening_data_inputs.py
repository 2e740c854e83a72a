"""Issue 39, the data and model inputs: what failed with MemoryError, an unnamed ValueError, a misleading
message or late in round 0 is refused (or handled) at set-up, exit 2 with one line naming the file or key.
All in one process: `--dry-run` through fedmpi's CLI, the loaders and `fedmpi.simulate` (nothing written)."""

from __future__ import annotations

import io
import textwrap
import zipfile

import h5py
import numpy as np
import pytest
import torch
from conftest import small_config, write_config

from fedmpi import config, simulate
from fedmpi.cli import main
from fedmpi.core.errors import EXIT_USAGE, ConfigError, InputError
from fedmpi.core.flat import FlatModel
from fedmpi.core.models import BUILDERS, build_model
from fedmpi.core.train import LocalTrainer, Schedule
from fedmpi.data import load_dataset
from fedmpi.data.array_sizes import refuse_beyond_memory

# Declared, never stored: 4 * 10^13 bytes (40 TB) of float32, beyond any node's memory.
HUGE = (10 ** 10, 1000)


def dry_run(capsys, tmp_path, **sections):
    """`fedmpi run CONFIG --dry-run` in this process on small_config(**sections): (exit code, stderr)."""
    path = write_config(tmp_path / "c.yaml", small_config(tmp_path / "out", **sections))
    code = main(["run", str(path), "--dry-run"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "MemoryError" not in err, err
    return code, err


def small_arrays(seed=0):
    g = np.random.default_rng(seed)
    return {"x_train": g.normal(size=(40, 6)).astype(np.float32), "y_train": np.arange(40) % 3,
            "x_test": g.normal(size=(12, 6)).astype(np.float32), "y_test": np.arange(12) % 3}


# -- finding 1: a file declaring more than the node's memory is sized from its shapes, not read -----------------

def _huge_hdf5(path, layout):
    with h5py.File(path, "w") as f:
        # Chunked and compressed (the chunks all fill values), or chunked and never written: a tiny file.
        f.create_dataset("x_train", shape=HUGE, dtype="float32", chunks=(1000, 1000),
                         **({"compression": "gzip"} if layout == "compressed" else {}))
        for key, value in small_arrays().items():
            if key != "x_train":
                f[key] = value
    return path


def _huge_npz(path):
    """An .npz whose x_train header declares HUGE (np.savez's layout: one .npy member per array)."""
    with zipfile.ZipFile(path, "w") as archive:
        with archive.open("x_train.npy", "w") as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": HUGE})
        for key, value in small_arrays().items():
            if key != "x_train":
                buffer = io.BytesIO()
                np.save(buffer, value)
                archive.writestr(f"{key}.npy", buffer.getvalue())
    return path


@pytest.mark.parametrize("kind", ["compressed", "unwritten", "npz"])
def test_dry_run_refuses_arrays_beyond_memory_from_their_shapes(capsys, tmp_path, kind):
    path = _huge_npz(tmp_path / "d.npz") if kind == "npz" else _huge_hdf5(tmp_path / "d.h5", kind)
    assert path.stat().st_size < 1_000_000
    code, err = dry_run(capsys, tmp_path, data={"name": "arrays", "root": str(path)})
    assert code == EXIT_USAGE
    assert f"data.root = '{path}': its arrays would take 40000.0 GB of memory (x_train, shape {HUGE} float32" in err
    assert "more than this node's" in err and "use a file whose arrays fit" in err
    assert not (tmp_path / "out").exists()
    # The real run loads the data set through the same loader: the same line, before any array is read.
    cfg = config.from_dict({"data": {"name": "arrays", "root": str(path)}})
    with pytest.raises(InputError, match="its arrays would take 40000.0 GB"):
        load_dataset(cfg)


def test_the_memory_bound_counts_arrays_as_the_data_set_holds_them():
    specs = {"x_train": ((100, 10), np.float64), "y_train": ((100,), np.int32)}     # float32 and int64 in memory
    refuse_beyond_memory(specs, "f", total=100 * 10 * 4 + 100 * 8)
    with pytest.raises(InputError, match=r"f: its arrays would take 0.0 GB .*x_train, shape \(100, 10\) float64"):
        refuse_beyond_memory(specs, "f", total=100 * 10 * 4 + 100 * 8 - 1)


# -- finding 2: a Hugging Face column of rows of different lengths ---------------------------------------------

def test_a_ragged_hugging_face_column_is_refused_naming_folder_and_column(tmp_path):
    datasets = pytest.importorskip("datasets")
    g = np.random.default_rng(2)

    def split(n):
        return datasets.Dataset.from_dict({"feat": [g.normal(size=2 + i % 3).tolist() for i in range(n)],
                                           "label": [i % 2 for i in range(n)]})

    folder = tmp_path / "hf"
    datasets.DatasetDict({"train": split(12), "test": split(4)}).save_to_disk(str(folder))
    cfg = config.from_dict({"data": {"name": "arrays", "root": str(folder), "columns": {"x": "feat", "y": "label"}}})
    with pytest.raises(InputError) as info:
        load_dataset(cfg)
    assert str(info.value).startswith(f"data.root = '{folder}', split train, column 'feat': holds rows of "
                                      f"different lengths"), info.value
    assert "one fixed-shape numeric array per column" in str(info.value)


# -- finding 3: bytes that are not a zip archive are not a valid .npz ------------------------------------------

@pytest.mark.parametrize("content", ["random", "truncated zip", "npy"])
def test_a_file_that_is_not_a_zip_archive_is_not_a_valid_npz(capsys, tmp_path, content):
    path = tmp_path / "d.npz"
    g = np.random.default_rng(3)
    if content == "random":
        path.write_bytes(g.bytes(1000))
    elif content == "truncated zip":
        np.savez(path, **small_arrays())
        path.write_bytes(path.read_bytes()[:300])
    else:
        np.save(tmp_path / "d.npy", small_arrays()["x_train"])
        (tmp_path / "d.npy").rename(path)
    code, err = dry_run(capsys, tmp_path, data={"name": "arrays", "root": str(path)})
    assert code == EXIT_USAGE
    assert f"data.root = '{path}': not a valid .npz file (a zip archive of .npy arrays" in err \
        or (content == "truncated zip" and f"data.root = '{path}': not a readable .npz file" in err), err
    assert "pickled" not in err


# -- finding 4: plug-in models in another precision than the float32 flat vector -------------------------------

PRECISION_NETS = '''\
import torch
from torch import nn


class Net(nn.Module):
    """Computes in its own dtype: the set-up probe passes, the float32 flat vector's training would not."""

    def __init__(self, input_shape, num_classes, dtype="float64", buffer=False):
        super().__init__()
        self.dtype = getattr(torch, dtype)
        width = 1
        for d in input_shape:
            width *= d
        self.fc = nn.Linear(width, num_classes, dtype=torch.float32 if buffer else self.dtype)
        if buffer:
            self.register_buffer("scale", torch.ones(1, dtype=torch.float64))

    def forward(self, x):
        return self.fc(x.flatten(1).to(self.fc.weight.dtype)).float()
'''


@pytest.fixture
def precision_nets(tmp_path, monkeypatch):
    (tmp_path / "precision_nets.py").write_text(textwrap.dedent(PRECISION_NETS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "precision_nets:Net"


@pytest.mark.parametrize("kwargs, named", [({"dtype": "float64"}, "'fc.weight' has dtype torch.float64"),
                                           ({"dtype": "float16"}, "'fc.weight' has dtype torch.float16"),
                                           ({"dtype": "bfloat16"}, "'fc.weight' has dtype torch.bfloat16"),
                                           ({"buffer": True}, "'scale' has dtype torch.float64")])
def test_a_plugin_model_not_in_float32_is_refused_at_set_up(capsys, tmp_path, precision_nets, kwargs, named):
    code, err = dry_run(capsys, tmp_path, model={"name": precision_nets, "kwargs": kwargs})
    assert code == EXIT_USAGE
    assert f"model.name = '{precision_nets}': {named}; fedmpi trains float32 models" in err, err
    assert "build the model in float32" in err
    cfg = config.from_dict({"model": {"name": precision_nets, "kwargs": kwargs}})
    with pytest.raises(ConfigError, match="fedmpi trains float32 models"):
        build_model(cfg.model, (1, 28, 28), 10)
    # float32, the default, builds
    assert build_model(config.from_dict({"model": {"name": precision_nets, "kwargs": {"dtype": "float32"}}}).model,
                       (1, 28, 28), 10) is not None


# -- finding 5: batch-norm layers and a batch of one sample ---------------------------------------------------

def _batch_norm_models():
    """The zoo's models that can hold batch norm, with the keys that put it in (from the zoo's own names)."""
    keys = {"mlp": {"mlp_norm": "batch", "hidden": 16}, "resnet18": {"norm": "batch"}}
    assert set(keys) <= set(BUILDERS)
    return [pytest.param(name, key, id=name) for name, key in keys.items()]


@pytest.mark.parametrize("name, keys", _batch_norm_models())
def test_a_one_sample_batch_skips_the_batch_statistics(name, keys):
    torch.manual_seed(0)
    # 8x8 images: resnet18's last stage is 1x1, so one sample leaves one value per channel there.
    shape = (3, 8, 8)
    flat = FlatModel(build_model(config.from_dict({"model": {"name": name, **keys}}).model, shape, 3))
    norms = [m for m in flat.module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert norms
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(5, *shape, generator=g), torch.randint(0, 3, (5,), generator=g)
    trainer = LocalTrainer(flat, config.ClientConfig(lr=0.1, batch_size=4), x, y)
    before = flat.vec.clone()
    stats = [(m.running_mean.clone(), m.running_var.clone()) for m in norms]
    # A client of one sample: its one batch steps, the running statistics stay as they were.
    loss, seen = trainer.train(torch.tensor([2]), np.random.default_rng(5), Schedule(4, 1))
    assert seen == 1 and torch.isfinite(loss)
    assert not torch.equal(flat.params, before[:flat.n_params])
    assert all(torch.equal(m.running_mean, mean) and torch.equal(m.running_var, var)
               for m, (mean, var) in zip(norms, stats))
    assert all(m.training for m in norms)       # training mode restored after the batch
    # A client of B + 1 samples: a full batch (which moves the statistics), then its one-sample last batch.
    loss, seen = trainer.train(torch.arange(5), np.random.default_rng(6), Schedule(4, 2))
    assert seen == 5 and torch.isfinite(loss)
    assert not torch.equal(norms[0].running_mean, stats[0][0])


def test_fedbn_runs_with_clients_whose_last_batch_holds_one_sample():
    cfg = {"seed": 3, "rounds": 1, "data": {"name": "synthetic"},
           "partition": {"clients": 4, "scheme": "natural", "samples_per_client": 11},
           "model": {"name": "mlp", "hidden": 8, "mlp_norm": "batch"}, "algorithm": {"name": "fedbn"},
           "client": {"batch_size": 10, "epochs": 1}, "server": {"clients_per_round": 4},
           "runtime": {"threads": 1}}
    result = simulate(cfg)
    assert np.isfinite(result.metrics["train_loss"]).all()
