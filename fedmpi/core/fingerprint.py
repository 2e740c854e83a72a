"""The model fingerprint the run log records per round (/metrics/model_sha256), which `fedmpi verify`
and forks compare."""

from __future__ import annotations

import hashlib

import numpy as np


def fingerprint(vec):
    """The fingerprint the run log records (/metrics/model_sha256): SHA-256 of the float32 (little-endian)
    bytes of the vector, a numpy array or a torch tensor (hashed in place where it already is such bytes)."""
    if hasattr(vec, "detach"):
        vec = vec.detach().cpu().numpy()
    return hashlib.sha256(np.ascontiguousarray(vec, dtype="<f4")).hexdigest()
