"""Personal parameters: which entries of the flat model vector each client keeps for itself (personalized FL).

A `ParameterSplit` is derived once from the model's named parameters and buffers (`FlatModel.entries`) and a
tuple of fnmatch patterns over their names (FedPer's head `"3.*"`, FedBN's normalization layers). It holds
the index tensors of the shared and the personal entries of the flat vector, in vector order. Shared entries
go through the collectives; personal ones stay in each client's state (docs/how-to/own-algorithm.md, "Personal
parameters").

The split is pure indexing: it knows nothing of clients, ranks or the config. What refuses a bad pattern
(one that matches nothing, a union that matches everything) is `split_model`, which names the key the
pattern came from.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from fedmpi.core.errors import ConfigError
from fedmpi.core.lazy import torch


@dataclass(frozen=True)
class ParameterSplit:
    """The flat vector's shared and personal entries. `shared_idx`/`personal_idx`: int64 index tensors (CPU)
    in increasing order that together cover 0..dim-1 once; `names`: the personal entries' parameter and buffer
    names, in vector order."""

    dim: int
    shared_idx: torch.Tensor
    personal_idx: torch.Tensor
    names: tuple = ()

    @classmethod
    def from_mask(cls, mask, names=()):
        """The split whose personal entries are where the boolean `mask` (dim entries) is True."""
        mask = torch.as_tensor(mask, dtype=torch.bool)
        return cls(int(mask.numel()), torch.nonzero(~mask).reshape(-1), torch.nonzero(mask).reshape(-1),
                   tuple(names))

    @classmethod
    def none(cls, dim):
        """Nothing personal: every entry is shared."""
        return cls.from_mask(torch.zeros(dim, dtype=torch.bool))

    @property
    def shared_dim(self) -> int:
        return int(self.shared_idx.numel())

    @property
    def personal_dim(self) -> int:
        return int(self.personal_idx.numel())

    def __bool__(self):
        """True when anything is personal (an empty split behaves as no split at all)."""
        return self.personal_dim > 0

    def _on(self, idx, vec):
        return idx if idx.device == vec.device else idx.to(vec.device)

    def shared(self, vec: torch.Tensor) -> torch.Tensor:
        """The shared entries of `vec` (its first `dim` entries), a new tensor."""
        return vec[: self.dim][self._on(self.shared_idx, vec)]

    def personal(self, vec: torch.Tensor) -> torch.Tensor:
        """The personal entries of `vec` (its first `dim` entries), a new tensor."""
        return vec[: self.dim][self._on(self.personal_idx, vec)]

    def merge(self, shared: torch.Tensor | None, personal: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        """Writes `shared` (shared_dim entries) and `personal` (personal_dim entries) into their places in
        `out` (dim entries, in place; None leaves that part of `out` as it is); returns `out`."""
        if shared is not None:
            out.index_copy_(0, self._on(self.shared_idx, out), shared.to(out.dtype))
        if personal is not None:
            out.index_copy_(0, self._on(self.personal_idx, out), personal.to(out.dtype))
        return out

    def put_personal(self, out: torch.Tensor, personal: torch.Tensor) -> torch.Tensor:
        """`out`'s personal entries set to `personal`, in place (the shared ones untouched)."""
        return self.merge(None, personal, out)


def matching(entries, pattern) -> list:
    """The (name, offset, numel) entries whose name matches the fnmatch `pattern`."""
    return [e for e in entries if fnmatch.fnmatchcase(e[0], pattern)]


def personal_names(entries, dim, sources) -> tuple:
    """The names of the personal entries of a flat model with `entries` ((name, offset, numel),
    FlatModel.entries or ModelShape.entries) and `dim` entries, for the patterns of `sources`:
    ((key, patterns), ...), e.g. (("model.personal", ("3.*",)), ("algorithm.name = 'fedper'", ("3.*",))), in
    vector order. The union of every pattern is personal. ConfigError naming the key when a pattern matches no
    entry or when nothing is left shared. Pure (no torch): the resolve step asks it before anything is built."""
    names, problems = set(), []
    for key, patterns in sources:
        for pattern in patterns:
            found = matching(entries, pattern)
            if not found:
                problems.append(f"{key}: pattern {pattern!r} matches none of the model's parameters and buffers "
                                f"({_listing(entries)})")
            names.update(name for name, _, _ in found)
    if problems:
        raise ConfigError(problems)
    if dim and sum(numel for name, _, numel in entries if name in names) == dim:
        keys = " and ".join(key for key, patterns in sources if patterns)
        raise ConfigError(f"{keys}: the personal patterns match every parameter and buffer of the model, so nothing "
                          f"would be shared; leave at least one layer shared (algorithm.name = 'local' trains "
                          f"without any aggregation)")
    return tuple(name for name, _, _ in entries if name in names)


def split_of(entries, dim, names) -> ParameterSplit:
    """The split whose personal entries are the entries named `names` (personal_names' answer)."""
    mask = torch.zeros(dim, dtype=torch.bool)
    for name, offset, numel in entries:
        if name in names:
            mask[offset: offset + numel] = True
    return ParameterSplit.from_mask(mask, tuple(names))


def split_model(entries, dim, sources) -> ParameterSplit:
    """personal_names(entries, dim, sources) as a ParameterSplit."""
    return split_of(entries, dim, personal_names(entries, dim, sources))


def _listing(entries, limit=12):
    names = [name for name, _, _ in entries]
    shown = ", ".join(names[:limit])
    return f"names: {shown}" + (f", ... ({len(names)} in all)" if len(names) > limit else "")
