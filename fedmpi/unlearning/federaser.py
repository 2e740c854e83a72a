"""FedEraser's calibration (Liu et al., "FedEraser: Enabling Efficient Client-Level Data Removal from Federated
Learning Models", IWQoS 2021), as an upload stage of the calibration run (`unlearning.method: federaser`).

The original run recorded each counted client's update U_k^t (checkpoint.updates). The calibration run starts
from the same initial model (same seed) without the forgotten clients (counterfactual.drop); in its round j
each remaining client k trains from the unlearned model M'_j, usually with fewer local steps (client.steps of
this run), giving U'_k. This stage, first on the upload path, replaces it with

    |U_k^{j * every}| * U'_k / |U'_k|          (Euclidean norms of the whole flat update)

so that FedAvg's weighted average of start + calibrated update is the paper's M'_{j+1} = M'_j + sum_k w_k
calibrated_k / sum_k w_k. Every later stage (and checkpoint.updates' recorder) sees the calibrated update.

This follows the paper's per-client rule. The authors' released code (file Fed_Unlearn_base.py, function
unlearning_step_once, as copied in github.com/Zoybzo/FedEraser-Code at c68c5ca) differs from it: it
calibrates per layer (each state_dict entry's own norms) and the plain mean over clients of the models
rather than each client's update, and its first round averages the recorded client models unchanged. Those
variants are not implemented here.
"""

from __future__ import annotations

from fedmpi.algorithms.hooks import REDUCE
from fedmpi.core.errors import InputError
from fedmpi.core.lazy import torch
from fedmpi.uploads.base import UploadStage

ORDER_CALIBRATE = 5     # before every other stage: an attack, compression or privacy act on the calibrated update
SHOWN_MISSING = 5       # a refusal names at most this many missing (round, client) pairs


def calibrated(delta, recorded_norm):
    """`delta` rescaled to length `recorded_norm` (its norm computed in float64); a zero delta has no
    direction to rescale and stays zero. A new tensor of delta's dtype."""
    norm = float(torch.linalg.vector_norm(delta.double()))
    if norm == 0.0:
        return delta.clone()
    return delta * (float(recorded_norm) / norm)


def original_round(j, every) -> int:
    """The original's round that calibration round j replays."""
    return int(j) * int(every)


def problems(unlearning, *, rounds, clients, clients_per_round, counted, protocol, algorithm_name) -> list:
    """Why FedEraser cannot replay `unlearning.original` (one line each; empty where it can, or method none).
    `counted`: the client ids whose updates count in every round of the calibration run (all clients but the
    dropped and removed ones). Reads the original's recorded update attributes (no vectors)."""
    if unlearning.method != "federaser":
        return []
    from fedmpi.uploads.recorded import update_norms

    found = []
    if protocol != REDUCE:
        found.append(f"unlearning.method: federaser rescales each client's update before the server's sum, "
                     f"which only algorithms uploading by reduce have; algorithm.name = {algorithm_name!r} "
                     f"uploads by {protocol!r}")
    if clients_per_round != clients:
        found.append(f"unlearning.method: federaser replays every client of each recorded round: set "
                     f"server.clients_per_round = partition.clients ({clients}); it is {clients_per_round}")
    try:
        norms = update_norms(unlearning.original)
    except InputError as e:
        return [*found, f"unlearning.original = {unlearning.original!r}: {e}"]
    recorded = max(norms, default=-1) + 1
    if rounds and original_round(rounds - 1, unlearning.every) >= recorded:
        most = -(-recorded // unlearning.every)
        found.append(f"unlearning: rounds = {rounds} with every = {unlearning.every} replays original round "
                     f"{original_round(rounds - 1, unlearning.every)}, but {unlearning.original} recorded rounds "
                     f"0..{recorded - 1}; set rounds <= {most}")
        return found
    missing = [(original_round(j, unlearning.every), cid) for j in range(rounds) for cid in sorted(counted)
               if cid not in norms.get(original_round(j, unlearning.every), {})]
    if missing:
        shown = ", ".join(f"round {t} client {cid}" for t, cid in missing[:SHOWN_MISSING])
        more = f" and {len(missing) - SHOWN_MISSING} more" if len(missing) > SHOWN_MISSING else ""
        found.append(f"unlearning.original = {unlearning.original!r} has no recorded update of {shown}{more}; "
                     f"FedEraser rescales each counted client's update to its recorded one (record the original "
                     f"with checkpoint.updates: true, every client counted)")
    return found


class FedEraserStage(UploadStage):
    """Each counted client's update rescaled to its recorded norm at the replayed original round."""

    name, order = "federaser", ORDER_CALIBRATE
    reads = ("unlearning", "rounds")

    @classmethod
    def build(cls, setting, *, unlearning, rounds):
        """The stage where unlearning.method is federaser and the algorithm uploads by reduce (fedmpi.run.resolve
        has checked the recording); None otherwise. Reads the recorded norms of the replayed rounds."""
        if unlearning.method != "federaser" or setting.algo.protocol != REDUCE:
            return None
        from fedmpi.uploads.recorded import update_norms

        recorded = update_norms(unlearning.original)
        replayed = {j: recorded.get(original_round(j, unlearning.every), {}) for j in range(rounds)}
        return cls(replayed)

    def __init__(self, norms):
        """`norms`: {calibration round: {cid: the recorded update's norm at the round it replays}}."""
        self.norms = norms

    def client(self, update, view):
        target = self.norms[int(update.round)][int(update.cid)]
        update.vector.copy_(update.start + calibrated(update.delta(), target))
        return update
