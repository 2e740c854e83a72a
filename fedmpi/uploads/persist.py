"""What an upload stage keeps beyond a round, and where it goes: the run file's attributes and checkpoints.

Separate from the round's hooks (fedmpi.uploads.base): a stage's transform is a value in, a value out; what
it must remember (a compression residual per client, the adaptive clip's estimator, the accountant's noise
multiplier) is declared here and saved under its own names, `/stage_<name>/...` for the server's state and
`/clients/<cid>/...` for a client's (docs/explanation/design.md §7).
"""

from __future__ import annotations


class StageState:
    def attrs(self) -> dict:
        """Rank 0: attributes for run.h5 (written when the run starts or resumes)."""
        return {}

    def state(self) -> dict:
        """Rank 0: the stage's server state for a checkpoint (numpy arrays or floats)."""
        return {}

    def load_state(self, state: dict):
        pass

    def client_state(self, cid) -> dict:
        return {}

    def bind_client_state(self, store):
        """Keeps the stage's per-client state (if any) in the rank's ClientStateStore (fedmpi.algorithms.state)."""

    def load_client_state(self, cid, state: dict):
        pass
