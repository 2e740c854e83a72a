"""SHA-256 digests of the trace files a deployment reads, kept in checkpoints so that a resume finds a trace
that changed since (the config hash covers the paths only)."""

from __future__ import annotations

import hashlib

import numpy as np

from fedmpi.core.errors import InputError
from fedmpi.core.input_files import read_input


def trace_files(clients):
    """{name: path} of the trace files a ClientsConfig reads."""
    named = {"availability": clients.trace if clients.availability == "trace" else None,
             "speed": clients.speed.trace if clients.speed.kind == "trace" else None,
             "bandwidth": clients.bandwidth.trace if clients.bandwidth.kind == "trace" else None}
    return {name: path for name, path in named.items() if path}


def trace_digests(clients) -> dict:
    """{"trace_sha256_<name>": 32 uint8} per trace file: the config hash covers the paths, these the
    contents, so a resume finds a trace that changed since the checkpoint."""
    out = {}
    for name, path in trace_files(clients).items():
        digest = hashlib.sha256(read_input(path, f"the {name} trace {path!r}")).digest()
        out[f"trace_sha256_{name}"] = np.frombuffer(digest, dtype=np.uint8).copy()
    return out


def check_digests(clients, saved: dict):
    for key, now in trace_digests(clients).items():
        if key in saved and not np.array_equal(np.asarray(saved[key], dtype=np.uint8), now):
            name = key.removeprefix("trace_sha256_")
            path = trace_files(clients)[name]
            raise InputError(f"--resume: the {name} trace {path!r} changed since the checkpoint was written "
                             f"(its SHA-256 differs); restore the file, or start a new run")
