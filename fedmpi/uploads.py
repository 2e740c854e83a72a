"""The client-to-server path of an upload, as stages between a client's training and its `accumulate`.

A stage may change the trained vector in place (an update compressed and decoded as the server would see
it, or clipped), the client's weight (`run.weight`) and the bytes its upload costs (`run.payload_bytes`),
and may keep per-client state that checkpoints save (under its own names). On the server it sees the
reduced sums before the server update and may change them and their total weight (noise, expected
cohort size). Stages apply to REDUCE algorithms; each says in `check` which algorithms it refuses.
With no stage configured (the default) the path is exactly the algorithm's own.
"""

from __future__ import annotations


class UploadStage:
    name = ""
    keeps_client_state = False    # per-client state (e.g. a compression residual): clients train on their host

    @classmethod
    def check(cls, cfg, algo_cls):
        """Raises ConfigError for an algorithm this stage cannot serve (before anything is written)."""

    def client(self, run, down, model):
        """Worker: the client's trained vector is in `model.vec`, its start point in `down`."""

    def server(self, t, sums, weight) -> float:
        """Server: may change the reduced `sums` in place; returns the total weight to divide by."""
        return weight

    def client_state(self, cid) -> dict:
        return {}

    def load_client_state(self, cid, state: dict):
        pass

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict):
        pass


def build_stages(cfg, algo, dim) -> list:
    """The configured stages, in the order an upload passes them."""
    from fedmpi.deploy.stage import stages_for

    return stages_for(cfg, algo, dim)       # update compression (client.compress)
