"""A frozen base once per node: the parameters nothing trains (a language model's weights under LoRA adapters,
fedmpi.core.causal_lm) and the base's buffers, held in one MPI shared-memory window per node
(`comm.share_arrays`, as the data set is: fedmpi.data.shared) instead of one private copy per rank.

Every rank builds the same model from the seed (or loads the same folder); the node's first rank then copies
its frozen tensors into the window, and every rank of the node, the first included, rebinds each frozen
tensor to its read-only view there, so its private copy is freed. A rank's memory then holds its share of
the base (PSS: the base / ranks on the node) plus its own adapters, optimizer state and activations. The
building itself still holds one whole private base per rank for a moment, before the sharing frees it.

The views are read-only by contract: nothing trains them (requires_grad False) and FlatModel leaves them out
of the flat vector, so no load, step or aggregation writes them. A `copy.deepcopy` of the module (MOON's
frozen copies, eval.divergence's shadow model, fedmpi.algorithms.reinit.fresh_init) copies the base into
private memory: none of them is on the path of a plain LoRA run (FedAvg and its kin), and a private copy is
what reinit needs, since it resets parameters in place.

At -n 1 (one process, no node to share with) and on GPU nodes (each device takes its own copy of the base
when the model moves there) the tensors stay as built.

`base_sha256` is the base's content hash, recorded in run.h5 (`base_sha256`); --resume and --fork-from refuse
a run whose base differs (`check_same_base`).
"""

from __future__ import annotations

import hashlib
import os
import warnings

from fedmpi.core.errors import ConfigError
from fedmpi.core.lazy import torch

RUN_ATTR = "base_sha256"
# The module attribute set-up leaves the hash in, for run.h5's attributes (fedmpi.round.experiment.run_attrs).
MODULE_ATTR = "fedmpi_base_sha256"


def frozen_tensors(module) -> dict:
    """{name: tensor} of the frozen base, in name order: the parameters with requires_grad False (a tied
    weight once, under its first name) and the buffers `fedmpi_frozen_buffers` names."""
    from fedmpi.core.flat import frozen_buffer_names

    frozen = frozen_buffer_names(module)
    tensors = {n: p for n, p in module.named_parameters() if not p.requires_grad}
    tensors.update((n, b) for n, b in module.named_buffers() if n in frozen)
    return dict(sorted(tensors.items()))


def frozen_size(module) -> tuple:
    """(entries, bytes) of the frozen base."""
    tensors = frozen_tensors(module).values()
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def base_sha256(module) -> str:
    """SHA-256 over the frozen base: each tensor's name, dtype, shape and bytes, in name order; "" when the
    model has no frozen part."""
    tensors = frozen_tensors(module)
    if not tensors:
        return ""
    digest = hashlib.sha256()
    for name, t in tensors.items():
        a = t.detach().cpu().contiguous().numpy()
        digest.update(f"{name}|{a.dtype.str}|{a.shape}\n".encode())
        digest.update(memoryview(a).cast("B"))
    return digest.hexdigest()


def share_base(module, comm) -> None:
    """Collective over the node (every rank of the node calls it with the same model): the frozen base into
    the node's shared window, each frozen tensor rebound to its read-only view there."""
    tensors = frozen_tensors(module)
    if comm.size == 1 or not tensors:
        return
    arrays = comm.share_arrays(_specs(tensors) if comm.node_leader else None, _copier(tensors))
    owners = _owners(module)
    with warnings.catch_warnings():
        # torch warns that a tensor over a non-writable array may be written; these are never written
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        for name, t in tensors.items():
            view = torch.from_numpy(arrays[name]).view(t.shape)
            holder, attr = owners[name]
            if attr in holder._parameters:
                holder._parameters[attr].data = view    # the same Parameter object: tied weights stay tied
            else:
                holder._buffers[attr] = view


def _specs(tensors):
    return {name: (tuple(t.shape), t.detach().numpy().dtype) for name, t in tensors.items()}


def _copier(tensors):
    def fill(arrays, part, parts):
        if part == 0:       # the node's first rank copies; the others' copies are the same bytes
            for name, a in arrays.items():
                a[...] = tensors[name].detach().numpy()
    return fill


def _owners(module):
    """{full name: (submodule, attribute)} of every parameter and buffer, for rebinding."""
    owners = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for table in (sub._parameters, sub._buffers):
            for attr in table:
                owners.setdefault(f"{prefix}.{attr}" if prefix else attr, (sub, attr))
    return owners


def check_same_base(run_file, digest, flag, model):
    """ConfigError (exit 2) unless the run file `run_file` (the run --resume continues, the parent of
    --fork-from, as `flag` says) recorded the same base as this run's `digest`."""
    import h5py

    if not os.path.exists(run_file):
        return
    with h5py.File(run_file, "r", locking=False) as f:
        recorded = str(f.attrs.get(RUN_ATTR, ""))
    if recorded == digest:
        return
    where = f"model.path = {model.path!r}" if model.path else "model.path = null"
    raise ConfigError(f"{flag}: {where}: the frozen base model differs from the one {run_file} was trained on "
                      f"(base sha256 {recorded[:16] or 'none'}, now {digest[:16] or 'none'}); give the same "
                      f"base model folder")
