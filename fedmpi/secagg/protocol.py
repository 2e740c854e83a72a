"""One round of SecAgg / SecAgg+ as pure functions: the set-up every rank derives, a client's masked upload,
the shares a client deals, and the server's unmasking of the modular sum (Bonawitz et al. 2017, section 4;
Bell et al. 2020 for the sparse graph).

The round's cohort U1 is the plan's selected clients: they advertise their public keys and deal Shamir
shares of two secrets, the key-agreement secret sk_u and the self-mask seed b_u, to the holders
{u} + neighbours(u) (encrypted to each holder in the deployed protocol; only their bytes are counted here).
Client u uploads

    y_u = q_u + PRG(b_u) + sum_{v in N(u), u < v} PRG(s_uv) - sum_{v in N(u), u > v} PRG(s_uv)   (mod 2^b)

with s_uv = agree(sk_u, pk_v). The survivors U2 (the clients whose update counts) upload y_u; the others
dropped after the set-up, so the survivors' y carry pairwise masks with them. The server then asks the
survivors for shares: of sk_u for each dropped u (to recompute and cancel s_uv with u's surviving
neighbours) and of b_v for each survivor v (to cancel its self mask); an honest survivor never reveals
both of one client. Any secret with fewer than t surviving holders cannot be reconstructed, and the round
fails as the protocol aborts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from fedmpi.core import rng
from fedmpi.secagg import agreement, shamir
from fedmpi.secagg.graph import round_graph
from fedmpi.secagg.masks import PAIR, SELF, expand, ring_mask


@dataclass(frozen=True)
class RoundSetup:
    """What every rank knows of round `round` before anyone masks: the cohort, the graph, each client's
    holder index (1..S) and public key; the secrets are drawn on demand from the client's own stream."""

    mode: str
    bits: int
    threshold: int
    seed: int
    round: int
    length: int                 # entries of a masked vector
    cohort: tuple
    graph: dict                 # client -> sorted neighbours
    index: dict                 # client -> its Shamir evaluation point, 1..S
    public: dict                # client -> pk

    def holders(self, u) -> list:
        """Who holds shares of u's secrets: u itself and its neighbours."""
        return sorted([u, *self.graph[u]])


def setup(mode, cohort, neighbours, threshold, bits, length, seed, round_) -> RoundSetup:
    cohort = tuple(int(c) for c in cohort)
    graph = round_graph(mode, cohort, neighbours, seed, round_)
    public = {u: agreement.public_key(agreement.secret_key(seed, round_, u)) for u in cohort}
    return RoundSetup(mode, int(bits), int(threshold), int(seed), int(round_), int(length), cohort, graph,
                      {u: i + 1 for i, u in enumerate(cohort)}, public)


def masked_upload(s: RoundSetup, u: int, q_ring: np.ndarray) -> tuple:
    """(y_u, PRG expansions): client u's integer update `q_ring` (uint64 in Z_{2^b}) under its self mask and
    its pairwise masks with every neighbour."""
    sk = agreement.secret_key(s.seed, s.round, u)
    y = q_ring.astype(np.uint64, copy=True)
    y += expand(agreement.self_seed(s.seed, s.round, u), s.length, s.bits, SELF)
    for v in s.graph[u]:
        m = expand(agreement.agree(sk, s.public[v]), s.length, s.bits, PAIR)
        if u < v:
            y += m
        else:
            y -= m
    y &= ring_mask(s.bits)
    return y, 1 + len(s.graph[u])


def deal(s: RoundSetup, u: int, holders, which: str) -> dict:
    """{holder index: share} of u's secret `which` ('sk' or 'b') for the given holders: the values u's
    polynomial takes there. The polynomial's coefficients come from u's stream, so any subset of holders
    gets the shares the full dealing gave them."""
    secret = (agreement.secret_key(s.seed, s.round, u) if which == "sk"
              else agreement.self_seed(s.seed, s.round, u))
    coeffs = rng.stream(s.seed, rng.SECAGG, s.round, u, agreement.SHARE_COEFFS, 0 if which == "sk" else 1)
    return shamir.share(secret, s.threshold, [s.index[h] for h in holders], coeffs)


@dataclass
class Unmasked:
    """The server's unmasking: the sum of the survivors' q in Z_{2^b} (None when the round failed)."""

    total: np.ndarray | None
    failed: str = ""            # why the round failed ('' when it did not)
    expansions: int = 0         # PRG expansions of `length` entries the server made
    seconds: float = 0.0
    reconstructed: dict = field(default_factory=dict)     # (client, 'sk' | 'b') -> the secret


def unmask(s: RoundSetup, total: np.ndarray, survivors) -> Unmasked:
    """Server: removes from the modular sum `total` of the survivors' y the pairwise masks they share with
    dropped clients (from sk_u, reconstructed) and their own self masks (from b_v, reconstructed)."""
    began = time.perf_counter()
    alive = {int(v) for v in survivors}
    out = Unmasked(total.astype(np.uint64, copy=True))
    for u in s.cohort:
        which = "b" if u in alive else "sk"
        holders = [h for h in s.holders(u) if h in alive]
        if len(holders) < s.threshold:
            out.total, out.failed = None, (f"client {u}'s {'self-mask seed' if which == 'b' else 'key'} has "
                                           f"{len(holders)} surviving share holders, the threshold is "
                                           f"{s.threshold}")
            break
        secret = shamir.reconstruct(deal(s, u, holders[: s.threshold], which), s.threshold)
        out.reconstructed[(u, which)] = secret
        if which == "b":
            out.total -= expand(secret, s.length, s.bits, SELF)
            out.expansions += 1
            continue
        for v in s.graph[u]:
            if v in alive:      # v added +PRG(s_uv) when v < u, else subtracted it
                m = expand(agreement.agree(secret, s.public[v]), s.length, s.bits, PAIR)
                out.expansions += 1
                if v < u:
                    out.total -= m
                else:
                    out.total += m
    if out.total is not None:
        out.total &= ring_mask(s.bits)
    out.seconds = time.perf_counter() - began
    return out
