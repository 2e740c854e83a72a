"""What an algorithm is built with and set up with, beside its own keys: `AlgorithmContext` (seed, sizes, the
clients' training settings, the participation history), and `SetupContext` (what `Algorithm.setup` sees on
every rank). Never the whole config (docs/explanation/design.md §6)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedmpi.core import rng
from fedmpi.core.lazy import torch
from fedmpi.core.personal import ParameterSplit
from fedmpi.core.schedules import LearningRate, ScheduleConfig


@dataclass(frozen=True)
class ClientTraining:
    """The clients' training settings (the `client:` keys an algorithm's rules read): FSL's default server
    schedule, central SGD's batches, FedNova's normaliser, data sharing's warm-up batch."""

    lr: float                     # eta_l before client.lr_schedule
    batch_size: int
    epochs: int                   # local epochs, used when `steps` is None
    steps: int | None             # local SGD steps per round (None: epochs)
    momentum: float
    drop_last: bool               # each epoch's short last batch is dropped
    lr_schedule: ScheduleConfig = ScheduleConfig()


class ParticipationHistory(Protocol):
    """Who trained in a round, the same on every rank (FedSkip's slot weights ask for past rounds). Exact for
    the current and the previous round under every participation provider, and for any past round where the
    provider's plan is a pure function of the round (the standard draw, Poisson sampling, the deployment under
    `clients.availability: always`, which SlotRouting requires); a provider with a clock (availability
    traces, FedBuff's) plans an older round from its current state, so ask those only for t and t - 1."""

    def selected(self, t: int) -> np.ndarray:
        """Round t's selected clients."""


class PlanHistory:
    """The participation provider's history: round t's selected clients are `plan(t).selected` (`plan`: the
    run's provider's `plan`, which every rank computes alike from the config, the seed and the round). The
    algorithm is built before its provider (which asks it whom it selects), so the set-up binds `plan` once
    the provider exists; it is asked only during the rounds."""

    def __init__(self, plan: Callable | None = None):
        self.plan = plan

    def bind(self, plan: Callable):
        self.plan = plan

    def selected(self, t):
        return np.asarray(self.plan(t).selected)


@dataclass(frozen=True)
class StandardDraws:
    """The standard draw's history (fedmpi.core.rng.select_clients), for an algorithm built without a run's
    participation provider (hook tests, `--dry-run`); it is what the default provider plans."""

    seed: int
    num_clients: int
    clients_per_round: int

    def selected(self, t):
        return rng.select_clients(self.seed, t, self.num_clients, self.clients_per_round)


@dataclass(frozen=True)
class AlgorithmContext:
    """What an algorithm knows of the run beyond its own keys (built once, by
    `fedmpi.algorithms.algorithm_context`); never the whole config."""

    seed: int                     # the run's seed: every stream an algorithm draws from starts here
    num_clients: int              # partition.clients (N)
    clients_per_round: int        # server.clients_per_round (S)
    rounds: int                   # the run's rounds (cosine schedules without a horizon use it)
    dim: int                      # entries of the flat model vector (trainable entries, then float buffers)
    n_params: int                 # its trainable entries
    history: ParticipationHistory   # round t's selected clients, on every rank
    client: ClientTraining        # the clients' training settings
    client_rate: LearningRate     # eta_l under client.lr_schedule: the one the clients train with
    privacy_enabled: bool = False   # privacy.mechanism is on (FedNova then takes every a_i as 1)
    # The flat vector's shared and personal entries (model.personal and the class's `personal_patterns`);
    # None when nothing is personal (an empty split is passed as None).
    split: ParameterSplit | None = None

    def client_lr(self, round_) -> float:
        """eta_l of round `round_` under client.lr_schedule (what `ClientRun.lr` holds on the clients)."""
        return self.client_rate.at(round_)


@dataclass
class SetupContext:
    """What `Algorithm.setup` receives on every rank."""

    sizes: np.ndarray             # the clients' sample counts, before `clients` reshaped them
    server_idx: np.ndarray        # the server's set as indices into the training set (empty if none)
    x0: torch.Tensor              # the initial model, the same on every rank (CPU)
    # accuracy(vec, indices) of a model on training samples, where this rank hosts clients (SAFL's probe)
    probe: Callable | None = None
    # the rank's FlatModel, for seeded fresh initialisations (fedmpi.algorithms.reinit.fresh_init: IFCA's
    # cluster models); None in hook tests that need none
    model: object = None
