"""`client.compress` as an upload stage (fedmpi.uploads.base): a client's update is compressed, with error
feedback where configured, and replaced by what the server decodes before the algorithm's `accumulate`.

The compressed vector is the update of the first uploaded vector, delta = y_i - x_t (the trained model
minus the broadcast one), so the server adds back what it received: the algorithm sees the client as if
it had trained to x_t + C(delta). A second uploaded vector (SCAFFOLD's Delta c_i) travels dense, and its
bytes are counted dense. State the algorithm keeps from the trained vector (SCAFFOLD's c_i, FedDyn's g_i,
MOON's previous model, SAFL's z_k) is therefore derived from the decoded update, which is what the server
holds too (docs/how-to/deployment.md, section 7). The stage is called only for updates that count, so a dropped
or late client's residual stays as it was.
"""

from __future__ import annotations

import math

from fedmpi.deploy.compress import UpdateCompression, kept_count
from fedmpi.uploads.base import ORDER_COMPRESS, UploadStage


def upload_bytes(client, server, secagg, algo) -> int:
    """Bytes one client's upload costs (from the `client`, `server` and `secagg` sections): the compressed first
    vector plus the others dense; under secure aggregation the masked vector, b bits per uploaded entry
    (fedmpi.secagg; its key and share messages, a few hundred bytes, are not timed on the simulated clock)."""
    dim, compress = algo.dim, UpdateCompression(client.compress)
    if server.secure_aggregation != "none":
        c = client.compress
        kept = kept_count(c.fraction, dim) if c.name == "randk" else dim
        return math.ceil(kept * secagg.bits / 8)
    return compress.payload_bytes(dim) + (algo.up_vectors - 1) * 4 * dim


class CompressionStage(UploadStage):
    name, order = "compress", ORDER_COMPRESS
    reads = ("client", "server", "seed")

    @classmethod
    def build(cls, setting, *, client, server, seed):
        """The stage where `client.compress.name` is not none; None otherwise."""
        if client.compress.name == "none":
            return None
        # Under secure aggregation rand-k's indices are the round's, shared by its clients (fedmpi.secagg).
        return cls(client.compress, setting.algo.up_vectors, setting.dim, seed,
                   shared=server.secure_aggregation != "none")

    def __init__(self, compress, up_vectors, dim, seed, shared=False):
        self.compression = UpdateCompression(compress, shared)
        self.seed, self.dim = seed, dim
        self.dense_rest = (up_vectors - 1) * 4 * dim
        # Residuals live with their client: its updates must always be made on its host rank.
        self.keeps_client_state = self.compression.feedback

    def client(self, update, view):
        compressed = self.compression.compress(update.delta(), self.seed, update.round, update.cid)
        update.vector.copy_(update.start + compressed.vector)
        self.compression.commit(update.cid, compressed)     # the residual, the client's own state
        return update.replace(bytes=compressed.nbytes + self.dense_rest)

    def client_state(self, cid) -> dict:
        return self.compression.state(cid)

    def bind_client_state(self, store):
        self.compression.bind_client_state(store)

    def load_client_state(self, cid, state: dict):
        self.compression.load(cid, state)
