"""The factories that pick a round's participation provider and upload stages from the config. They live
above fedmpi.deploy and fedmpi.privacy (which build on the bases in fedmpi.plans and fedmpi.uploads.base), so the
bases import nothing back."""

from __future__ import annotations

from fedmpi.attacks.stage import AttackStage, needs_stage
from fedmpi.deploy.compress import randk_indices
from fedmpi.deploy.participation import participation_for
from fedmpi.deploy.stage import stages_for
from fedmpi.plans.base import Everyone, Participation
from fedmpi.privacy import accounting
from fedmpi.privacy.accounting import Sampling
from fedmpi.privacy.sampling import PoissonSampling
from fedmpi.privacy.stage import PrivacyStage
from fedmpi.secagg.stage import SecAggStage


def build_participation(cfg, algo, part_sizes) -> Participation:
    """The provider for `cfg`; `part_sizes` are the sample counts of the clients the algorithm trains:
    deployment realism (issue 15), Poisson sampling (differential privacy), or the standard draw."""
    provider = participation_for(cfg, algo, part_sizes)
    if provider is not None:
        return provider
    if cfg.server.sampling == "poisson":
        return PoissonSampling(cfg, algo)
    return Everyone(algo, seed=cfg.seed, num_clients=cfg.partition.clients,
                    clients_per_round=cfg.server.clients_per_round)


def build_stages(cfg, algo, dim, malicious=()) -> list:
    """The configured stages, in the order an upload passes them: a model attack on the `malicious` clients'
    updates (the client crafts its update first, fedmpi.attacks.stage), update compression (client.compress),
    then differential privacy, which must bound exactly what is summed, or secure aggregation, which masks
    what is summed (the two are exclusive: fedmpi.secagg.checks)."""
    stages = [AttackStage(cfg.attack, malicious, cfg.seed, dim)] if needs_stage(cfg.attack) and len(malicious) else []
    stages += list(stages_for(cfg, algo, dim))
    if cfg.privacy.enabled:
        stages.append(PrivacyStage(cfg, algo, dim))
    if cfg.server.secure_aggregation != "none":
        stages.append(secagg_stage(cfg, algo, dim))
    return stages


def secagg_stage(cfg, algo, dim) -> SecAggStage:
    """The secure-aggregation stage, told the coordinates rand-k keeps (shared by the round's clients) and
    how the accountant charges its distributed noise (as Gaussian noise of multiplier secagg.noise_multiplier
    on the sum, fixed-size sampling: docs/privacy.md)."""
    compress, keys = cfg.client.compress, cfg.secagg
    kept = None
    if compress.name == "randk":
        def kept(t):
            return randk_indices(compress.fraction, dim, cfg.seed, t, 0, shared=True)

    def curve():
        sampling = Sampling("fixed", cfg.partition.clients, cfg.server.clients_per_round)
        return accounting.epsilon_curve(cfg.rounds, keys.delta, sampling, keys.noise_multiplier, "rdp")

    return SecAggStage(cfg, algo, dim, kept, curve if keys.noise != "none" else None)
