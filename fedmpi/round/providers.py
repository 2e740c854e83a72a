"""The catalogs of a round's participation providers and upload stages, and their builds from the sections
each declares. They live above fedmpi.deploy, fedmpi.privacy, fedmpi.secagg and fedmpi.attacks (which build
on the bases in fedmpi.plans and fedmpi.uploads.base), so the bases import nothing back.

Each class declares `reads` (the config's sections and top-level values its `build` takes by name) and
`build(setting, **sections)`, the component those sections ask for or None. The assembler
(fedmpi.round.experiment) hands each class exactly the sections it reads; nothing here sees the config.
  stages     every class whose build answers is on the upload path, in the order the stages declare
  providers  the first provider whose build answers plans the rounds (the standard draw last: it always does)
"""

from __future__ import annotations

from fedmpi.attacks.stage import AttackStage
from fedmpi.deploy.buffered import BufferedParticipation
from fedmpi.deploy.compress import randk_indices
from fedmpi.deploy.participation import DeployParticipation
from fedmpi.deploy.stage import CompressionStage
from fedmpi.plans.base import Participation, ProviderSetting
from fedmpi.privacy import accounting
from fedmpi.privacy.accounting import Sampling
from fedmpi.privacy.sampling import PoissonSampling
from fedmpi.privacy.stage import PrivacyStage
from fedmpi.round.robust_stage import NormBoundStage
from fedmpi.secagg.checks import plan_for
from fedmpi.secagg.stage import SecAggStage
from fedmpi.unlearning.federaser import FedEraserStage
from fedmpi.uploads.base import StageSetting, ordered
from fedmpi.uploads.precision import WirePrecision
from fedmpi.uploads.record import UpdateRecorder


class SecureAggregation(SecAggStage):
    """Secure aggregation as a round builds it: told the coordinates rand-k keeps (fedmpi.deploy, shared by the
    round's clients) and, on rank 0, how the accountant (fedmpi.privacy) charges its distributed noise: as
    Gaussian noise of multiplier secagg.noise_multiplier on the sum, fixed-size sampling (docs/how-to/privacy.md)."""

    reads = ("secagg", "server", "client", "partition", "rounds", "seed")

    @classmethod
    def build(cls, setting, *, secagg, server, client, partition, rounds, seed):
        if server.secure_aggregation == "none":
            return None
        compress, dim = client.compress, setting.dim
        kept = None
        if compress.name == "randk":
            def kept(t):
                return randk_indices(compress.fraction, dim, seed, t, 0, shared=True)
        curve = None
        if setting.on_server and secagg.noise != "none":
            sampling = Sampling("fixed", partition.clients, server.clients_per_round)
            curve = accounting.epsilon_curve(rounds, secagg.delta, sampling, secagg.noise_multiplier, "rdp")
        max_weight = max(setting.sizes, default=1) if secagg.weighting == "samples" else None
        return cls(secagg, plan_for(secagg, server, partition), seed, dim, kept, curve, max_weight)


STAGES = (FedEraserStage, AttackStage, CompressionStage, PrivacyStage, SecureAggregation, NormBoundStage, WirePrecision,
          UpdateRecorder)
PROVIDERS = (BufferedParticipation, DeployParticipation, PoissonSampling, Participation)


def build_stages(setting: StageSetting, given: dict) -> list:
    """The upload stages `given` ({stage class: the sections it reads, by name}) ask for, in their order."""
    built = (cls.build(setting, **sections) for cls, sections in given.items())
    return ordered(stage for stage in built if stage is not None)


def build_participation(setting: ProviderSetting, given: dict) -> Participation:
    """The first provider of `given` ({provider class: the sections it reads}, in priority order) that the
    sections ask for."""
    for cls, sections in given.items():
        provider = cls.build(setting, **sections)
        if provider is not None:
            return provider
    raise ValueError("no participation provider answered (the standard draw must come last)")
