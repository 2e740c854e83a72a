"""The `lora:` section (exported as fedmpi.config.LoraConfig; it lives here, beside the model code that reads
it, as the privacy and deployment sections live beside theirs, since fedmpi.core may not import fedmpi.config):
low-rank adapters (peft's LoRA) over a frozen causal language model (`model.name: causal_lm`,
fedmpi.core.causal_lm). Only the adapters (and the parameters `trainable` names) are trained, so only they
are in the flat vector that travels, is aggregated and is checkpointed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedmpi.core.config_checks import Checks as _Checks
from fedmpi.core.config_checks import Range, factor

# A rank of a million would be an adapter larger than any layer it adapts.
MAX_RANK = 1 << 20


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on a causal language model (`lora:`; used by model.name: causal_lm only): peft's
    `LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules)`."""

    rank: int | None = 8
    """The adapters' rank r (peft's `r`); null: no adapters, the whole language model is trained (full
    fine-tuning)."""
    alpha: float = 16.0
    """peft's `lora_alpha`: the adapters' product B A is scaled by alpha / rank."""
    dropout: float = 0.0
    """peft's `lora_dropout`: dropout on the adapters' input while training."""
    target_modules: tuple[str, ...] | None = None
    """The module names peft puts adapters on (peft's `target_modules`); null: peft's default for the model
    type (gpt2: c_attn)."""
    trainable: tuple[str, ...] = ()
    """fnmatch patterns over parameter names (named_parameters) of more parameters trained beside the
    adapters, e.g. ['*ln_f*']; they travel in the flat vector with the adapters. A tied weight has its first
    name only (gpt2's output layer is its token embedding, `*wte*`)."""

    RANGES: ClassVar[dict] = {"rank": Range(1, MAX_RANK, f"at most {MAX_RANK}: a rank beyond any layer's width"),
                              "alpha": factor(low_open=True), "dropout": Range(0, 1, high_open=True)}

    def __post_init__(self):
        c = _Checks("lora")
        c.require(self.rank is None or self.rank >= 1, "rank", self.rank, "must be a positive integer or null "
                  "(full fine-tuning)")
        c.require(self.alpha > 0, "alpha", self.alpha, "must be > 0")
        c.require(0 <= self.dropout < 1, "dropout", self.dropout, "must be in [0, 1)")
        c.require(self.target_modules is None or (self.target_modules and all(
            isinstance(m, str) and m for m in self.target_modules)), "target_modules", self.target_modules,
            "must be a non-empty list of module names (e.g. [c_attn]) or null (peft's default)")
        c.require(all(isinstance(p, str) and p for p in self.trainable), "trainable", self.trainable,
                  "must be a list of non-empty fnmatch patterns over parameter names, e.g. ['*lm_head*']")
        c.require(self.rank is not None or (self.target_modules is None and not self.trainable), "rank", self.rank,
                  "is null (full fine-tuning: every parameter is trained); lora.target_modules and lora.trainable "
                  "would change nothing then: remove them or set a rank")
        c.done()
