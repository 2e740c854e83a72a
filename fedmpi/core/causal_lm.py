"""`model.name: causal_lm`: a Hugging Face causal language model (transformers), with peft's LoRA adapters
(the `lora` section) over its frozen weights, predicting the next token of a sequence.

The task is LEAF Shakespeare's next character, the one the zoo's `lstm` learns: x is a window of 80
character ids, y the character after it, and the model's output is the logits at the window's last
position, [B, vocab], so that cross-entropy, accuracy (= token accuracy) and perplexity (= exp(mean
cross-entropy)) are those of the lstm. The vocabulary is the data set's classes.

The language model comes from a local folder (`model.path`: `from_pretrained(path, local_files_only=True)`
in float32; clusters have no network, the user brings the weights) or is built fresh from transformers
config keys (`model.arch`, model_type gpt2 by default) under the seeded generator set-up draws the initial
model from, so every rank builds the same one. With `lora.rank` set, peft wraps it
(`get_peft_model(lm, LoraConfig(r, lora_alpha, lora_dropout, target_modules))`): the base's parameters are
frozen (requires_grad False) and FlatModel leaves them out of the flat vector, which is then the adapters
(`*lora_A*`, `*lora_B*`) and whatever `lora.trainable` names. With `lora.rank: null` the whole model trains.

transformers and peft are imported here only, when a causal_lm is built: fedmpi runs without them.
"""

from __future__ import annotations

import fnmatch
import inspect
import os
import warnings

from fedmpi.core.errors import ConfigError
from fedmpi.core.lazy import nn, torch

INSTALL = "pip install 'fedmpi[llm]'"


def libraries():
    """(transformers, peft), or a ConfigError naming model.name and the extra that installs them."""
    try:
        import peft
        import transformers
    except ImportError as e:
        raise ConfigError(f"model.name = 'causal_lm' needs transformers and peft ({e.name or e} cannot be "
                          f"imported): {INSTALL}") from None
    return transformers, peft


class LastTokenLM(nn.Module):
    """A causal language model as a classifier of its input's next token: forward(tokens [B, T] uint8 or
    int64) gives the logits at the last position, [B, vocab]. `lm` is the peft model (or the bare Hugging
    Face model when lora.rank is null), so parameter names read like
    `lm.base_model.model.transformer.h.0.attn.c_attn.lora_A.default.weight`.

    `fedmpi_frozen_buffers` names the buffers the model had when built (a rotary embedding's frequencies...):
    part of the frozen base, so FlatModel leaves them out of the flat vector. A buffer an algorithm adds
    later is not in it and travels as usual."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        self.fedmpi_frozen_buffers = frozenset(name for name, _ in self.named_buffers())
        # The head's product for the last position only, where the model can (transformers' `logits_to_keep`):
        # the other 79 positions' logits would be computed and dropped.
        forward = getattr(lm, "get_base_model", lambda: lm)().forward
        self._last_only = "logits_to_keep" in inspect.signature(forward).parameters

    def forward(self, tokens):
        # Shakespeare's ids are uint8 in memory (fedmpi.data.leaf); float inputs go in as they are and fail, so a
        # model that cannot take the data is refused at set-up (fedmpi.core.models.check_takes).
        if tokens.dtype == torch.uint8:
            tokens = tokens.long()
        extra = {"logits_to_keep": 1} if self._last_only else {}
        return self.lm(input_ids=tokens, use_cache=False, **extra).logits[:, -1]


def build(model, lora, shape, classes) -> LastTokenLM:
    """The LastTokenLM of the `model` section (path or arch) with the `lora` section's adapters, for
    sequences of `shape` ([T]) over `classes` tokens."""
    if len(shape) != 1:
        raise ConfigError(f"model.name = 'causal_lm': needs token sequences (data.name: shakespeare), but the "
                          f"dataset's inputs have shape {tuple(shape)}")
    transformers, peft = libraries()
    lm = _from_folder(transformers, model.path) if model.path else _from_arch(transformers, model.arch, classes)
    vocab = getattr(lm.config, "vocab_size", None)
    if vocab != classes:
        key = f"model.path = {model.path!r}" if model.path else f"model.arch = {model.arch!r}"
        raise ConfigError(f"{key}: the model's vocab_size is {vocab}, but the data set has {classes} classes (its "
                          f"vocabulary); use a model made for this data set's characters")
    positions = _positions(lm.config)
    if positions is not None and positions < shape[0]:
        raise ConfigError(f"model.name = 'causal_lm': the model takes at most {positions} positions, the data "
                          f"set's sequences have {shape[0]}; raise model.arch's n_positions")
    lm.config.use_cache = False         # no key/value cache: every forward pass sees the whole window
    if lora.rank is not None:
        lm = _with_adapters(peft, lm, lora)
    module = LastTokenLM(lm)
    _train_also(module, lora.trainable)
    return module


def _from_folder(transformers, path):
    if not os.path.isdir(path):
        raise ConfigError(f"model.path = {path!r}: no such folder; give a local Hugging Face model folder (what "
                          f"save_pretrained writes: config.json and the weights)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ConfigError(f"model.path = {path!r}: the folder has no config.json; give a local Hugging Face model "
                          f"folder (what save_pretrained writes)")
    # transformers draws a progress bar over the weights' files; every rank would draw its own into the job's log
    transformers.utils.logging.disable_progress_bar()
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"model.path = {path!r}: cannot be loaded as a causal language model: {reason}") from None


def _from_arch(transformers, arch, classes):
    keys = dict(arch)
    if "vocab_size" in keys:
        raise ConfigError(f"model.arch.vocab_size = {keys['vocab_size']!r}: set by the data set (its {classes} "
                          f"classes); remove it")
    model_type = keys.pop("model_type", "gpt2")
    # No special tokens unless named: gpt2's defaults (50256) lie outside a character vocabulary, and the
    # next-character task uses none.
    keys.setdefault("bos_token_id", None)
    keys.setdefault("eos_token_id", None)
    try:
        lm_config = transformers.AutoConfig.for_model(model_type, vocab_size=classes, **keys)
        return transformers.AutoModelForCausalLM.from_config(lm_config, dtype=torch.float32)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"model.arch = {arch!r}: not a transformers causal language model's config: "
                          f"{reason}") from None


def _positions(lm_config):
    """The positions a transformers config takes (None where it does not say)."""
    for key in ("n_positions", "max_position_embeddings"):
        value = getattr(lm_config, key, None)
        if isinstance(value, int):
            return value
    return None


def _with_adapters(peft, lm, lora):
    adapters = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                               target_modules=list(lora.target_modules) if lora.target_modules else None)
    try:
        with warnings.catch_warnings():
            # gpt2's projections are transformers' Conv1D (weights stored transposed); peft notices and sets
            # fan_in_fan_out itself, saying so each time.
            warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*", category=UserWarning)
            # peft reads a transformers property that transformers 5 renamed and warns about
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return peft.get_peft_model(lm, adapters)
    except ValueError as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        key = f"lora.target_modules = {list(lora.target_modules)!r}" if lora.target_modules else \
            "lora.target_modules = null"
        raise ConfigError(f"{key}: peft cannot put adapters on this model ({reason}); name the modules to adapt, "
                          f"e.g. [c_attn] for gpt2") from None


def _train_also(module, patterns):
    """requires_grad on the parameters `lora.trainable`'s patterns match (each must match one)."""
    named = list(module.named_parameters())
    for pattern in patterns:
        hits = [p for name, p in named if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            some = ", ".join(name for name, _ in named[-3:])
            raise ConfigError(f"lora.trainable = {pattern!r}: matches no parameter of the model (names look like "
                              f"{some})")
        for p in hits:
            p.requires_grad_(True)
