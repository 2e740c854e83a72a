"""The factories that pick a round's participation provider and upload stages from the config. They live
above fedmpi.deploy and fedmpi.privacy (which build on the bases in fedmpi.plans and fedmpi.uploads.base), so the
bases import nothing back."""

from __future__ import annotations

from fedmpi.attacks.stage import AttackStage, needs_stage
from fedmpi.deploy.participation import participation_for
from fedmpi.deploy.stage import stages_for
from fedmpi.plans.base import Everyone, Participation
from fedmpi.privacy.sampling import PoissonSampling
from fedmpi.privacy.stage import PrivacyStage


def build_participation(cfg, algo, part_sizes) -> Participation:
    """The provider for `cfg`; `part_sizes` are the sample counts of the clients the algorithm trains:
    deployment realism (issue 15), Poisson sampling (differential privacy), or the standard draw."""
    provider = participation_for(cfg, algo, part_sizes)
    if provider is not None:
        return provider
    if cfg.server.sampling == "poisson":
        PoissonSampling.check(cfg, type(algo))
        return PoissonSampling(cfg, algo)
    return Everyone(cfg, algo)


def build_stages(cfg, algo, dim, malicious=()) -> list:
    """The configured stages, in the order an upload passes them: a model attack on the `malicious` clients'
    updates (the client crafts its update first, fedmpi.attacks.stage), update compression (client.compress),
    then differential privacy, which must bound exactly what is summed."""
    stages = [AttackStage(cfg.attack, malicious, cfg.seed, dim)] if needs_stage(cfg.attack) and len(malicious) else []
    stages += list(stages_for(cfg, algo, dim))
    if cfg.privacy.enabled:
        PrivacyStage.check(cfg, type(algo))
        stages.append(PrivacyStage(cfg, algo, dim))
    return stages
