"""`client.compress` as an upload stage (fedmpi.uploads.base): a client's update is compressed, with error
feedback where configured, and replaced by what the server decodes before the algorithm's `accumulate`.

The compressed vector is the update of the first uploaded vector, delta = y_i - x_t (the trained model
minus the broadcast one), so the server adds back what it received: the algorithm sees the client as if
it had trained to x_t + C(delta). A second uploaded vector (SCAFFOLD's Delta c_i) travels dense, and its
bytes are counted dense. State the algorithm keeps from the trained vector (SCAFFOLD's c_i, FedDyn's g_i,
MOON's previous model, SAFL's z_k) is therefore derived from the decoded update, which is what the server
holds too (docs/deployment.md, section 7). The stage is called only for updates that count, so a dropped
or late client's residual stays as it was.
"""

from __future__ import annotations

import math

from fedmpi.deploy.compress import UpdateCompression, kept_count
from fedmpi.uploads.base import UploadStage


def upload_bytes(cfg, algo) -> int:
    """Bytes one client's upload costs: the compressed first vector plus the others dense; under secure
    aggregation the masked vector, b bits per uploaded entry (fedmpi.secagg; its key and share messages,
    a few hundred bytes, are not timed on the simulated clock)."""
    dim, compress = algo.dim, UpdateCompression(cfg.client.compress)
    if cfg.server.secure_aggregation != "none":
        c = cfg.client.compress
        kept = kept_count(c.fraction, dim) if c.name == "randk" else dim
        return math.ceil(kept * cfg.secagg.bits / 8)
    return compress.payload_bytes(dim) + (algo.up_vectors - 1) * 4 * dim


class CompressionStage(UploadStage):
    name = "compress"

    def __init__(self, cfg, algo, dim):
        # Under secure aggregation rand-k's indices are the round's, shared by its clients (fedmpi.secagg).
        shared = cfg.server.secure_aggregation != "none"
        self.compression = UpdateCompression(cfg.client.compress, shared)
        self.seed, self.dim = cfg.seed, dim
        self.dense_rest = (algo.up_vectors - 1) * 4 * dim
        # Residuals live with their client: its updates must always be made on its host rank.
        self.keeps_client_state = self.compression.feedback

    def client(self, run, down, model):
        x = down[: self.dim]
        compressed = self.compression.compress(model.vec - x, self.seed, run.round, run.cid)
        model.vec.copy_(x + compressed.vector)
        self.compression.commit(run.cid, compressed)
        run.payload_bytes = compressed.nbytes + self.dense_rest

    def client_state(self, cid) -> dict:
        return self.compression.state(cid)

    def bind_client_state(self, store):
        self.compression.bind_client_state(store)

    def load_client_state(self, cid, state: dict):
        self.compression.load(cid, state)


def stages_for(cfg, algo, dim) -> list:
    """The deployment's upload stages: compression when `client.compress.name` is not none."""
    return [CompressionStage(cfg, algo, dim)] if cfg.client.compress.name != "none" else []
