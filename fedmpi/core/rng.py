"""Seeds derived from (seed, purpose, round, client) so that no result depends on `-n` or placement.

Every random choice in fedmpi takes its stream from `stream(seed, PURPOSE, ...)`: the round's clients from
`(seed, SELECT, round)`, a client's batches from `(seed, CLIENT, round, client)`, and so on. Ranks compute
the same streams independently, so nothing random ever travels between them.
"""

import numpy as np

from fedmpi.core.lazy import torch

# Purposes: distinct constants keep the streams of different uses independent.
INIT, SELECT, CLIENT, DATA, PARTITION, SERVER, CENTRAL = range(7)
# Later purposes: client-level DP noise, availability and dropout, the simulated clock (speeds, bandwidths),
# update compression, and the centralized shadow model of the weight-divergence instrument.
PRIVACY, AVAILABILITY, DROPOUT, CLOCK, COMPRESS, SHADOW = range(7, 13)
# Personalization, attacks and secure aggregation: each client's local test split, fine-tuning before a local
# evaluation, the malicious set and the attacks' own draws, personal models' extra randomness, the secure
# aggregation's pairwise and self masks, its shares and its stochastic rounding.
LOCAL_TEST, FINETUNE, ATTACK, PERSONAL, SECAGG = range(13, 18)
# eval.max_samples: the fixed subsample of the global test set that every evaluation of the run uses.
EVAL_SUBSET = 18


def stream(seed, purpose, *keys) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(purpose), *map(int, keys)]))


def torch_seed(seed, purpose, *keys) -> int:
    """A 63-bit torch seed from the same key tuple (for dropout and other torch-side randomness)."""
    return int(stream(seed, purpose, *keys).integers(0, 2**63 - 1))


def select_clients(seed, round_, num_clients, per_round) -> np.ndarray:
    """The round's participants, sorted; the same on every rank for any `-n`."""
    chosen = stream(seed, SELECT, round_).choice(num_clients, size=per_round, replace=False)
    return np.sort(chosen)


def seed_torch(seed, purpose, *keys):
    torch.manual_seed(torch_seed(seed, purpose, *keys))
