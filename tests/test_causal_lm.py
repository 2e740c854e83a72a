"""model.name: causal_lm (issue 54): a Hugging Face causal LM with peft's LoRA adapters as a next-character
classifier; the flat vector is the adapters; the frozen base's hash, its shared views and the dry run's sizes.
Small GPT-2s (width 32, 2 layers) on LEAF Shakespeare's 80-character windows; every draw seeded."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT

from fedmpi import config
from fedmpi.config import LoraConfig, ModelConfig
from fedmpi.core import shared_base
from fedmpi.core.causal_lm import LastTokenLM
from fedmpi.core.errors import ConfigError
from fedmpi.core.flat import FlatModel, forward_probe
from fedmpi.core.models import build_model, check_takes
from fedmpi.data.leaf import SHAKESPEARE_VOCAB
from fedmpi.mpi.local import LocalComm

pytest.importorskip("transformers")
pytest.importorskip("peft")

VOCAB = len(SHAKESPEARE_VOCAB)     # 80 characters: the data set's classes
WIDTH, LAYERS, RANK = 32, 2, 8
ARCH = {"n_layer": LAYERS, "n_embd": WIDTH, "n_head": 2, "n_positions": 80}


def tiny(seed=0, lora=None, **model_keys):
    torch.manual_seed(seed)
    model = ModelConfig(name="causal_lm", **({"arch": ARCH} | model_keys))
    return build_model(model, (80,), VOCAB, lora if lora is not None else LoraConfig(rank=RANK))


def windows(n=4, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (n, 80)).astype(np.uint8)


def test_the_flat_vector_is_the_adapters_alone():
    module = tiny()
    flat = FlatModel(module)
    # gpt2's c_attn maps WIDTH to 3 WIDTH: A is [r, WIDTH], B is [3 WIDTH, r], one pair per layer
    assert flat.dim == flat.n_params == LAYERS * (RANK * WIDTH + 3 * WIDTH * RANK)
    names = [name for name, _, _ in flat.entries]
    assert names[0] == "lm.base_model.model.transformer.h.0.attn.c_attn.lora_A.default.weight"
    assert all(("lora_A" in n) != ("lora_B" in n) for n in names)
    assert all(not p.requires_grad for n, p in module.named_parameters() if "lora_" not in n)
    base = sum(p.numel() for p in module.parameters() if not p.requires_grad)
    assert shared_base.frozen_size(module) == (base, 4 * base)


def test_output_is_the_last_positions_logits_of_the_whole_model():
    module = tiny().eval()
    x = torch.from_numpy(windows())
    with torch.no_grad():
        full = module.lm(input_ids=x.long()).logits[:, -1]
        out = module(x)
    assert out.shape == (4, VOCAB)
    torch.testing.assert_close(out, full, rtol=1e-5, atol=1e-6)


def test_adapters_start_as_the_base_and_identically_on_every_rank():
    a, b = tiny(seed=5), tiny(seed=5)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(pa, pb)
    lora_b = [p for n, p in a.named_parameters() if "lora_B" in n]
    assert lora_b and all(torch.count_nonzero(p) == 0 for p in lora_b)    # B = 0: B A adds nothing yet
    x = torch.from_numpy(windows())
    with torch.no_grad(), a.lm.disable_adapter():
        plain = a.eval()(x)
    torch.testing.assert_close(a(x), plain)
    assert shared_base.base_sha256(a) == shared_base.base_sha256(b)
    assert shared_base.base_sha256(tiny(seed=6)) != shared_base.base_sha256(a)


def test_training_moves_only_the_adapters():
    module = tiny()
    flat = FlatModel(module)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    x, y = torch.from_numpy(windows(8)), torch.from_numpy(np.arange(8) % VOCAB)
    torch.nn.functional.cross_entropy(module(x), y).backward()
    with torch.no_grad():
        flat.params.sub_(0.5 * flat.grad)
    moved = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_B" in n for n in moved)      # A's gradient is zero while B = 0


def test_takes_shakespeares_windows():
    module = tiny()
    check_takes(module, "causal_lm", "shakespeare", windows(1), VOCAB)
    assert forward_probe(module, windows(1))[:2] == ((1, VOCAB), "")
    with pytest.raises(ConfigError, match="needs token sequences"):
        build_model(ModelConfig(name="causal_lm"), (1, 28, 28), 10, LoraConfig())


def test_the_base_hash_is_sha256_over_the_frozen_tensors_in_name_order():
    module = tiny()
    digest = hashlib.sha256()
    names = sorted(n for n, p in module.named_parameters() if not p.requires_grad)
    params = dict(module.named_parameters())
    for name in names:
        a = params[name].detach().numpy()
        digest.update(f"{name}|{a.dtype.str}|{a.shape}\n".encode() + a.tobytes())
    assert shared_base.base_sha256(module) == digest.hexdigest()
    with torch.no_grad():
        params[names[-1]].view(-1)[0] += 1e-6      # one entry of the base, in its last bit or so
    assert shared_base.base_sha256(module) != digest.hexdigest()


def test_full_fine_tuning_trains_every_parameter():
    module = tiny(lora=LoraConfig(rank=None))
    flat = FlatModel(module)
    assert flat.dim == sum(p.numel() for p in module.parameters()) and shared_base.frozen_size(module) == (0, 0)
    assert shared_base.base_sha256(module) == ""


def test_trainable_patterns_add_parameters_beside_the_adapters():
    module = tiny(lora=LoraConfig(rank=RANK, trainable=("*ln_f*",)))
    names = [n for n, _, _ in FlatModel(module).entries]
    assert "lm.base_model.model.transformer.ln_f.weight" in names and len(names) == 2 * LAYERS + 2
    with pytest.raises(ConfigError, match=r"lora.trainable = '\*nothing\*': matches no parameter"):
        tiny(lora=LoraConfig(rank=RANK, trainable=("*nothing*",)))
    with pytest.raises(ConfigError, match="lora.target_modules"):
        tiny(lora=LoraConfig(rank=RANK, target_modules=("no_such_layer",)))


def test_a_saved_folder_loads_the_same_model(tmp_path):
    source = tiny(seed=3, lora=LoraConfig(rank=None)).eval()
    source.lm.save_pretrained(tmp_path / "base")
    loaded = build_model(ModelConfig(name="causal_lm", path=str(tmp_path / "base")), (80,), VOCAB,
                         LoraConfig(rank=None)).eval()
    x = torch.from_numpy(windows())
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), source(x), rtol=0, atol=0)
    adapted = build_model(ModelConfig(name="causal_lm", path=str(tmp_path / "base")), (80,), VOCAB, LoraConfig())
    assert FlatModel(adapted).dim == LAYERS * 4 * WIDTH * RANK


def test_a_bad_folder_is_refused_naming_model_path(tmp_path):
    model = lambda path: ModelConfig(name="causal_lm", path=str(path))  # noqa: E731
    with pytest.raises(ConfigError, match="model.path = .*no such folder"):
        build_model(model(tmp_path / "absent"), (80,), VOCAB, LoraConfig())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="model.path = .*no config.json"):
        build_model(model(tmp_path / "empty"), (80,), VOCAB, LoraConfig())
    tiny(lora=LoraConfig(rank=None)).lm.save_pretrained(tmp_path / "base")
    with pytest.raises(ConfigError, match="model.path = .*vocab_size is 80, but the data set has 62 classes"):
        build_model(model(tmp_path / "base"), (80,), 62, LoraConfig())


def test_bad_arch_is_refused_naming_model_arch():
    with pytest.raises(ConfigError, match="model.arch.vocab_size"):
        tiny(arch={**ARCH, "vocab_size": 80})
    with pytest.raises(ConfigError, match="model.arch = .*not a transformers"):
        tiny(arch={**ARCH, "model_type": "no_such_model"})
    with pytest.raises(ConfigError, match="at most 40 positions"):
        tiny(arch={**ARCH, "n_positions": 40})


def test_config_keys_are_checked():
    base = {"data": {"name": "shakespeare"}, "partition": {"scheme": "natural"}}
    cfg = config.from_dict({**base, "model": {"name": "causal_lm", "arch": ARCH}, "lora": {"rank": 4}})
    assert cfg.lora == LoraConfig(rank=4) and cfg.model.arch == ARCH
    refused = [({"model": {"name": "lstm"}, "lora": {"rank": 4}}, "lora = {'rank': 4}: adapts a causal language"),
               ({"model": {"name": "lstm", "path": "x"}}, "model.path = 'x': is not used by model.name 'lstm'"),
               ({"model": {"name": "causal_lm", "path": "x", "arch": ARCH}}, "model.arch = .*set one of them"),
               ({"model": {"name": "causal_lm"}, "lora": {"rank": 0}}, "lora.rank = 0"),
               ({"model": {"name": "causal_lm"}, "lora": {"dropout": 1.0}}, "lora.dropout = 1.0"),
               ({"model": {"name": "causal_lm"}, "lora": {"rank": None, "trainable": ["*ln_f*"]}}, "lora.rank = None")]
    for extra, message in refused:
        with pytest.raises(ConfigError, match=message):
            config.from_dict({**base, **extra})


def test_a_config_without_lora_keeps_its_hash():
    # The new keys at their defaults are left out of Config.hash, so runs from before them still resume: the
    # hashes below are what the code before model.path, model.arch and lora gave.
    assert config.Config().hash() == "4bd783fb1bf99655"
    old = {"model": {"name": "mlp", "hidden": 16}, "data": {"name": "shakespeare"}, "partition": {"scheme": "natural"}}
    assert config.from_dict(old).hash() == "ee517466d8dd0164"
    lm = {"model": {"name": "causal_lm", "arch": ARCH}}
    hashes = {config.from_dict({**lm, **extra}).hash()
              for extra in ({}, {"lora": {"rank": 4}}, {"lora": {"alpha": 8}}, {"model": {"name": "causal_lm"}})}
    assert len(hashes) == 4       # each of them changes the computation, so --resume tells them apart


def test_flat_model_leaves_the_bases_buffers_out_and_keeps_later_ones():
    inner = torch.nn.Linear(3, 2)
    inner.register_buffer("freq", torch.arange(4.0))
    module = LastTokenLM.__new__(LastTokenLM)
    torch.nn.Module.__init__(module)
    module.lm = inner
    module.fedmpi_frozen_buffers = frozenset({"lm.freq"})
    module.register_buffer("merged", torch.full((5,), 2.0))     # added later, e.g. by an algorithm
    flat = FlatModel(module)
    assert [n for n, _, _ in flat.entries] == ["lm.weight", "lm.bias", "merged"] and flat.dim == 6 + 2 + 5
    assert torch.equal(module.lm.freq, torch.arange(4.0))
    assert "lm.freq" in shared_base.frozen_tensors(copy.deepcopy(module))


def test_sharing_at_one_rank_changes_nothing_and_a_deepcopy_is_private():
    module = tiny()
    before = {n: t.data_ptr() for n, t in shared_base.frozen_tensors(module).items()}
    shared_base.share_base(module, LocalComm())
    assert {n: t.data_ptr() for n, t in shared_base.frozen_tensors(module).items()} == before
    twin = copy.deepcopy(module)
    name = "lm.base_model.model.transformer.wte.weight"
    original, copied = shared_base.frozen_tensors(module)[name], shared_base.frozen_tensors(twin)[name]
    assert copied.data_ptr() != original.data_ptr() and torch.equal(copied, original)


def test_the_dry_run_counts_the_base_once_per_node(tmp_path):
    from dataset_files import write_leaf

    write_leaf(tmp_path / "shakespeare", "shakespeare", users_train=(12, 9, 10), users_test=(3, 3, 2))
    wide = {**ARCH, "n_embd": 256, "n_head": 4}        # a base of some MB, so the table's 0.1 MB shows its shares
    proc = subprocess.run([sys.executable, "-m", "fedmpi", "run", "jobs/configs/shakespeare_lora.yaml",
                           f"data.root={tmp_path / 'shakespeare'}", f"out={tmp_path / 'run'}",
                           f"model.arch={json.dumps(wide)}", "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    module = tiny(arch=wide)
    entries, nbytes = shared_base.frozen_size(module)
    assert f"frozen base: {entries} parameters" in proc.stdout
    assert f"trained (the flat vector, what travels): {FlatModel(module).dim} entries" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("frozen base "))
    cells = [float(v) for v in row.split()[2:]]      # -n 2, 4, 8: per rank, per node
    assert cells[1::2] == [round(nbytes / 1e6, 1)] * 3                         # once per node, at any -n
    assert cells[0::2] == [round(math.ceil(nbytes / n) / 1e6, 1) for n in (2, 4, 8)]   # each rank its share


def test_fedmpi_runs_without_transformers_and_peft():
    script = ("import sys; sys.modules['transformers'] = None; sys.modules['peft'] = None\n"
              "import fedmpi\n"
              "from fedmpi.core.errors import ConfigError\n"
              "r = fedmpi.simulate(fedmpi.config.from_dict({'rounds': 1, 'partition': {'clients': 4}, "
              "'server': {'clients_per_round': 2}, 'runtime': {'progress': 'off'}}))\n"
              "from fedmpi.core.models import build_model\n"
              "from fedmpi.config import ModelConfig, LoraConfig\n"
              "try:\n"
              "    build_model(ModelConfig(name='causal_lm'), (80,), 80, LoraConfig())\n"
              "except ConfigError as e:\n"
              "    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "model.name = 'causal_lm' needs transformers and peft" in proc.stdout
    assert "pip install 'fedmpi[llm]'" in proc.stdout
