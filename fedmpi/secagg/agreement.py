"""The pairwise key agreement of SecAgg, simulated with its real arithmetic in a small group.

Bonawitz et al. derive the pairwise mask seed s_uv = KA.agree(sk_u, pk_v) = KA.agree(sk_v, pk_u) by
Diffie-Hellman. Here the same algebra runs in the multiplicative group of GF(2^61 - 1): pk_u = G^sk_u,
agree(sk_u, pk_v) = pk_v^sk_u = G^(sk_u sk_v). It is far too small to be secure, and that is the point: the
simulation needs the protocol's structure (the server learns s_uv for a dropped u only by reconstructing
sk_u from t Shamir shares and combining it with v's public key) at a cost of microseconds, not security.
What travels is counted at deployed sizes (PUBLIC_KEY_BYTES: X25519/Curve25519 keys, 32 bytes).
A client's secrets are drawn from (seed, SECAGG, round, client, purpose), so nothing depends on -n.
"""

from __future__ import annotations

import numpy as np

from fedmpi.core import rng

Q = 2 ** 61 - 1              # prime modulus of the simulated group
G = 3
PUBLIC_KEY_BYTES = 32        # what a deployed key (X25519) costs on the wire, per public key
KEY_SECRET, SELF_SEED, SHARE_COEFFS, ROUNDING, NOISE, MASK, GRAPH = range(7)    # sub-purposes of rng.SECAGG


def secret_key(seed, round_, cid) -> int:
    """sk_u in [1, Q - 1)."""
    return int(rng.stream(seed, rng.SECAGG, round_, cid, KEY_SECRET).integers(1, Q - 1))


def self_seed(seed, round_, cid) -> int:
    """b_u, the seed of u's self mask (64 bits)."""
    return int(rng.stream(seed, rng.SECAGG, round_, cid, SELF_SEED).integers(0, 2 ** 64, dtype=np.uint64))


def public_key(sk: int) -> int:
    return pow(G, int(sk), Q)


def agree(sk_u: int, pk_v: int) -> int:
    """The shared secret of u and v: pk_v^sk_u = G^(sk_u sk_v) mod Q (symmetric in u and v)."""
    return pow(int(pk_v), int(sk_u), Q)
