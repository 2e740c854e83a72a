"""Reduced-precision transport, one process (fedmpi.uploads.precision): rounding against hand-computed
values, the upload stage, the broadcast's rounding and byte counts in RoundBuffers, the config hash, the
refusals (before any file) and a --resume that would change the wire dtype. The -n invariance and the
bytes in /metrics are tests/test_wire_dtype_mpi.py's."""

from types import SimpleNamespace

import pytest
import torch
from conftest import write_config

from fedmpi import config
from fedmpi.cli import main
from fedmpi.mpi.local import LocalComm
from fedmpi.round.wire import CMD_RUN, RoundBuffers
from fedmpi.uploads import precision
from fedmpi.uploads.base import ClientUpdate, StageView


def _rounded(values, dtype):
    return precision.round_to(torch.tensor(values, dtype=torch.float32), dtype).tolist()


def test_bfloat16_rounds_to_nearest_even_on_8_significant_bits():
    # bfloat16 keeps 8 significant bits: spacing 2^-7 in [1, 2), 2^-3 in [16, 32).
    assert _rounded([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 17.0625, -3.0], "bfloat16") == \
        [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, 17.0, -3.0]
    # 0.1 = 1.6 * 2^-4: 1.6 to 7 fraction bits is 205/128 = 1.6015625, times 2^-4 = 0.10009765625.
    assert _rounded([0.1], "bfloat16") == [0.10009765625]


def test_float16_rounds_on_11_significant_bits_and_overflows_past_65504():
    assert _rounded([1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65520.0], "float16") == \
        [1.0, 1 + 2**-9, 65504.0, float("inf")]
    assert _rounded([0.1, 1 + 2**-11], "float32") == [pytest.approx(0.1), 1 + 2**-11]     # float32: unchanged
    assert precision.itemsize("bfloat16") == precision.itemsize("float16") == 2 and precision.itemsize("float32") == 4


def test_the_upload_stage_rounds_the_update_not_the_model():
    start = torch.tensor([100.0, 1.0, -2.0, 5.0])
    model = SimpleNamespace(vec=start + torch.tensor([2**-8, 3 * 2**-12, 0.1, 0.0]), dim=4)
    update = precision.WirePrecision("bfloat16", 4).client(ClientUpdate(0, 0, model.vec, start, 1.0), StageView(None))
    assert update.vector is model.vec
    # The update's entries rounded each to bfloat16 (3 * 2^-12 is exact; 0.1 -> 0.10009765625); the model
    # is the start plus them (float32).
    want = start + torch.tensor([2**-8, 3 * 2**-12, 0.10009765625, 0.0])
    assert torch.equal(model.vec, want)


def _buffers(wire_dtype, up_vectors=1):
    algo = SimpleNamespace(up_vectors=up_vectors, up_scalars=0, down_vectors=1, wire_dim=3, client_columns=())
    return RoundBuffers(LocalComm(), algo, 3, 4, torch.device("cpu"), False, wire_dtype=wire_dtype)


def test_the_broadcast_payload_is_rounded_before_it_leaves_and_bytes_count_two_per_entry():
    wire = _buffers("bfloat16")
    wire.broadcast(0, CMD_RUN, fill=lambda out: out.copy_(torch.tensor([0.1, 1 + 2**-8, 7.0])))
    assert wire.down().tolist() == [0.10009765625, 1.0, 7.0]
    assert wire.upload_bytes == 3 * 2
    assert _buffers("float32").upload_bytes == 3 * 4
    assert _buffers("bfloat16", up_vectors=2).upload_bytes == 3 * 2 + 3 * 4   # a second vector stays float32


def test_wire_dtype_is_hashed_only_when_it_rounds():
    base = config.from_dict({})
    assert config.from_dict({"runtime": {"wire_dtype": "float32"}}).hash() == base.hash()
    assert config.from_dict({"runtime": {"wire_dtype": "bfloat16"}}).hash() != base.hash()
    assert config.from_dict({"runtime": {"wire_dtype": "float16"}}).hash() != \
        config.from_dict({"runtime": {"wire_dtype": "bfloat16"}}).hash()


def _tiny(out, **sections):
    cfg = {"seed": 0, "rounds": 2, "out": str(out), "data": {"name": "synthetic"},
           "partition": {"clients": 6, "scheme": "natural", "samples_per_client": 20}, "model": {"name": "lr"},
           "server": {"clients_per_round": 3}, "runtime": {"threads": 1, "progress": "off"}}
    cfg.update(sections)
    return cfg


@pytest.mark.parametrize("sections,key", [
    ({"algorithm": {"name": "fedskip"}}, "route"),
    ({"client": {"compress": {"name": "topk", "fraction": 0.5}}}, "client.compress"),
], ids=["fedskip", "compress"])
def test_unsupported_combinations_are_refused_before_any_file(tmp_path, capsys, sections, key):
    cfg = write_config(tmp_path / "c.yaml", _tiny(tmp_path / "out", runtime={"wire_dtype": "bfloat16",
                                                                           "threads": 1, "progress": "off"},
                                                  **sections))
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "runtime.wire_dtype" in err and key in err, err
    assert not (tmp_path / "out" / "run.h5").exists()


def test_resume_refuses_a_changed_wire_dtype(tmp_path, capsys):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "c.yaml", _tiny(out, checkpoint={"every": 1}))
    assert main(["run", str(cfg), "rounds=1"]) == 0
    before = (out / "run.h5").read_bytes()
    assert main(["run", str(cfg), "--resume", "runtime.wire_dtype=bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "runtime.wire_dtype" in err and "cannot change on resume" in err, err
    assert (out / "run.h5").read_bytes() == before
