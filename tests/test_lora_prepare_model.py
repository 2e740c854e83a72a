"""`Algorithm.prepare_model` (issue 54): what the LoRA rules change in a model before it is flattened reaches every
place a model is built (set-up, --dry-run, the sweep's and memory's descriptions), and FLoRA's merged delta is
(W + delta) x on a Hugging Face GPT-2's Conv1D attention projection as on a Linear layer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import write_config
from dataset_files import write_mnist_family

pytest.importorskip("peft")

import torch  # noqa: E402
from test_lora_rules import LORA_MODEL, cfg_of  # noqa: E402

from fedmpi.algorithms import lora  # noqa: E402
from fedmpi.cli import main  # noqa: E402
from fedmpi.core.flat import FlatModel  # noqa: E402
from fedmpi.run.memory import model_size  # noqa: E402
from fedmpi.sweep.configs import _model_shape  # noqa: E402


# -- prepare_model where models are built to be described --------------------------------------------------------
def test_the_sweep_and_memory_descriptions_see_what_prepare_model_changed():
    data = SimpleNamespace(input_shape=(4,), num_classes=3, x_train=np.zeros((2, 4), dtype=np.float32))
    cache = {}
    shapes = {name: _model_shape(cfg_of(name), data, cache) for name in ("fedit", "ffa_lora", "flora")}
    # TinyLora((4,), 3, width 16, rank 4): fc1 A 4x4, B 16x4; fc2 A 4x16, B 3x4; FLoRA's deltas 16x4 and 3x16.
    a_entries, b_entries, deltas = 4 * 4 + 4 * 16, 16 * 4 + 3 * 4, 16 * 4 + 3 * 16
    assert shapes["fedit"].dim == a_entries + b_entries
    assert shapes["ffa_lora"].dim == b_entries                     # A frozen: outside the vector
    assert shapes["flora"].dim == a_entries + b_entries + deltas     # the merged deltas travel
    assert len(cache) == 3                  # one shape per algorithm that changes the model, keyed by its keys
    assert _model_shape(cfg_of("fedavg"), data, cache) is shapes["fedit"] and len(cache) == 3   # model as built
    assert _model_shape(cfg_of("fedit", product_gap=True), data, cache).dim == shapes["flora"].dim
    assert len(cache) == 4
    base = 16 * 4 + 16 + 3 * 16 + 3                                # fc1's and fc2's frozen weights and biases
    assert model_size(cfg_of("flora"), (4,), 3) == (a_entries + b_entries, a_entries + b_entries + deltas, base)
    assert model_size(cfg_of("ffa_lora"), (4,), 3) == (b_entries, b_entries, base + a_entries)   # A frozen too


@pytest.mark.parametrize("name,params,entries", [("ffa_lora", 16 * 4 + 10 * 4, 16 * 4 + 10 * 4),
                                                  ("flora", 4 * 784 + 16 * 4 + 4 * 16 + 10 * 4,
                                                   4 * 784 + 16 * 4 + 4 * 16 + 10 * 4 + 16 * 784 + 10 * 16)])
def test_the_dry_run_builds_the_prepared_model(tmp_path, capsys, name, params, entries):
    write_mnist_family(tmp_path / "mnist", "MNIST", n_train=40, n_test=10)
    path = write_config(tmp_path / "c.yaml", {
        "data": {"name": "mnist", "root": str(tmp_path / "mnist")}, "partition": {"clients": 4},
        "server": {"clients_per_round": 2}, "model": {"name": LORA_MODEL}, "algorithm": {"name": name},
        "runtime": {"threads": 1, "progress": "off"}, "out": str(tmp_path / "out")})
    assert main(["run", str(path), "--dry-run"]) == 0
    assert f"model: {LORA_MODEL}, {params} parameters ({entries} entries with buffers)" in capsys.readouterr().out


def test_flora_delta_on_gpt2_conv1d_is_the_merged_weight():
    transformers = pytest.importorskip("transformers")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=16, vocab_size=20,
                                     bos_token_id=0, eos_token_id=0)
    model = get_peft_model(transformers.GPT2LMHeadModel(config),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True))
    lora.add_delta_buffers(model, in_forward=True)
    flat = FlatModel(model)
    layout = lora.adapter_layout(flat)
    assert [(p.rank, p.d_in, p.d_out, p.scaling) for p in layout] == [(4, 32, 96, 2.0)] * 2
    model.eval()
    tokens = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(1))
    before = model(tokens).logits.detach()
    delta = 0.1 * torch.randn(96, 32, generator=torch.Generator().manual_seed(2))
    layout[0].D(flat.vec.detach()).copy_(delta)
    with_delta = model(tokens).logits.detach()
    layout[0].D(flat.vec.detach()).zero_()
    conv = dict(model.named_modules())[layout[0].name].get_base_layer()
    with torch.no_grad():
        conv.weight += delta.T          # Conv1D keeps its weight as [d_in, d_out]
    merged = model(tokens).logits.detach()
    assert (with_delta - before).abs().max() > 1e-2
    assert torch.allclose(with_delta, merged, atol=1e-5)
