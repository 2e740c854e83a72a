"""Reduced-precision transport (`runtime.wire_dtype`): what the broadcast model and each
client's upload are rounded to on the wire. float32 (the default) rounds nothing.

Where the rounding happens, so that every path sees the same numbers whatever -n:
- Down: rank 0 rounds the broadcast payload (the global model and whatever else the algorithm sends) in
  place before it leaves (fedmpi.round.wire.RoundBuffers.broadcast); every rank, rank 0 at -n 1 included,
  trains from that rounded copy. The server's own model x stays float32 (a real server keeps its master
  copy; only what travels is rounded).
- Up, REDUCE: `WirePrecision`, the LAST upload stage (after an attack, clipping and noise of differential
  privacy): the client's update, model - start (what the algorithm sums), is rounded to the wire dtype and
  the model set to start + rounded update. The algorithm's `accumulate` then sums it in float64 as before
  (so the -n invariance of the float64 sums is kept); what it reads back differs from the rounded update
  only by the float32 rounding of adding the start point back (below 2^-24 of the start's magnitude).
  Differential privacy is unharmed: rounding after the noise is post-processing.
- Up, GATHER (SAFL with gating): the uploaded vector is the trained model itself, and it is rounded as such.
Bytes: /metrics bytes_down and bytes_up count `itemsize` bytes per rounded entry (2 for bfloat16 and
float16); an algorithm's second upload vector (SCAFFOLD's control update) is not rounded and counts 4.

Refused (ConfigError naming runtime.wire_dtype): the ROUTE and BUFFER protocols (FedSkip's slots move only
between ranks that differ, so rounding them in transit would break -n invariance; FedBuff holds updates
outside the stage path), client.compress (the compressors count their own value encoding) and secure
aggregation (its field encoding is the wire format).
fp16's range ends at 65504: a larger entry becomes inf and the run stops as diverged (runtime.on_nonfinite).
"""

from __future__ import annotations

from fedmpi.algorithms.hooks import REDUCE
from fedmpi.core.lazy import torch
from fedmpi.uploads.base import ORDER_WIRE, UploadStage


def torch_dtype(wire_dtype):
    """The torch dtype of runtime.wire_dtype (read when first needed: the checks here import no torch)."""
    return getattr(torch, wire_dtype)
ROUNDED_PROTOCOLS = ("reduce", "gather")


def itemsize(wire_dtype):
    """Bytes per entry on the wire."""
    return torch.empty(0, dtype=torch_dtype(wire_dtype)).element_size()


def round_to(tensor, wire_dtype):
    """Rounds a float32 tensor in place to the nearest value of `wire_dtype` (round to nearest even, as
    torch's conversion does); returns it. float32: unchanged."""
    if wire_dtype != "float32":
        tensor.copy_(tensor.to(torch_dtype(wire_dtype)))
    return tensor


def problems(wire_dtype, protocol, *, algorithm_name, compress, secure_aggregation):
    """Why runtime.wire_dtype = `wire_dtype` cannot round the transport of algorithm.name = `algorithm_name`
    (uploading by `protocol`) with client.compress.name = `compress` and server.secure_aggregation =
    `secure_aggregation` (empty where it can, and at float32)."""
    name = wire_dtype
    if name == "float32":
        return []
    found = []
    if protocol not in ROUNDED_PROTOCOLS:
        found.append(f"runtime.wire_dtype: {name} is for the reduce and gather protocols; {algorithm_name} uses "
                     f"{protocol} (use float32)")
    if compress != "none":
        found.append(f"runtime.wire_dtype: {name} cannot follow client.compress ({compress}), which "
                     f"sets its own value encoding; use float32, or client.compress.name: none")
    if secure_aggregation != "none":
        found.append(f"runtime.wire_dtype: {name} cannot follow secure aggregation, whose field elements are the "
                     f"wire format; use float32")
    return found


class WirePrecision(UploadStage):
    """The last upload stage: the client's update rounded to the wire dtype (module docstring)."""

    name, order = "wire", ORDER_WIRE
    reads = ("runtime",)

    @classmethod
    def build(cls, setting, *, runtime):
        """The stage where runtime.wire_dtype is not float32 and the algorithm uploads by REDUCE (GATHER's
        vector is rounded where it is gathered); None otherwise."""
        if runtime.wire_dtype == "float32" or setting.algo.protocol != REDUCE:
            return None
        return cls(runtime.wire_dtype, setting.dim)

    def __init__(self, wire_dtype, dim):
        self.wire_dtype, self.dim = wire_dtype, dim

    def client(self, update, view):
        rounded = round_to(update.delta(), self.wire_dtype)
        update.vector.copy_(update.start + rounded)
        return update
