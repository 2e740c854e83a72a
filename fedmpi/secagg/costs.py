"""What the protocol costs a round, counted from its messages at deployed sizes (docs/how-to/secure-aggregation.md):
per client the bytes beyond the masked vector, per round the messages.

Sizes assumed: a public key 32 bytes (X25519; each client advertises two, for encryption and for mask
agreement), an encrypted share pair 2 * 16 (the two Shamir shares, elements of GF(2^127 - 1)) + 8 (the two
client ids) + 28 (AES-GCM nonce and tag) bytes, a client id 4 bytes, a share sent back in the unmasking
16 + 4 bytes. The four round trips (advertise keys, share keys, masked input, unmasking; the consistency
check of the actively secure variant is left out, as in Flower's SecAgg+).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedmpi.secagg.agreement import PUBLIC_KEY_BYTES
from fedmpi.secagg.shamir import SHARE_BYTES

ID_BYTES = 4
ENCRYPTED_SHARES_BYTES = 2 * SHARE_BYTES + 2 * ID_BYTES + 28
UNMASK_SHARE_BYTES = SHARE_BYTES + ID_BYTES


def masked_bytes(length: int, bits: int) -> int:
    """The masked vector: `length` entries of `bits` bits, packed."""
    return math.ceil(length * bits / 8)


@dataclass(frozen=True)
class ClientCost:
    up: int         # bytes beyond the masked vector
    down: int


def client_cost(degree: int, survivors: int, survived: bool) -> ClientCost:
    """One client's protocol bytes in a round where it has `degree` neighbours; a client that dropped out
    after the set-up paid the first two steps only."""
    up = 2 * PUBLIC_KEY_BYTES + degree * ENCRYPTED_SHARES_BYTES
    down = degree * (2 * PUBLIC_KEY_BYTES + ID_BYTES) + degree * ENCRYPTED_SHARES_BYTES
    if survived:    # the unmasking request (the survivors' ids) and its answer (one share per holder role)
        down += survivors * ID_BYTES
        up += (degree + 1) * UNMASK_SHARE_BYTES
    return ClientCost(up, down)


def messages(cohort: int, survivors: int) -> int:
    """Client-server messages of a round: keys and shares up and down for the cohort, the masked vectors
    up, the unmasking request down and its answer up for the survivors."""
    return 4 * cohort + 3 * survivors
