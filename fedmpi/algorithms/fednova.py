"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020).

Clients that run different numbers of local steps pull FedAvg's average toward the busier ones. FedNova
divides each client's update by its normaliser a_i, d_i = (x_t - y_i) / a_i, and rescales the average by
the effective step count: the update is -(sum_i p_i a_i) * sum_i p_i d_i, p_i = n_i / sum_j n_j over the
round's clients, so x_{t+1} = x_t + eta_g * update under `sgd` (eta_g = 1 is the paper's rule).

a_i is the number of local steps tau for plain SGD. With momentum rho (torch's SGD: buf = rho buf + g,
w -= lr buf) the k-th gradient moves w by lr (1 - rho^(tau-k)) / (1 - rho) in total, and summing over
k gives a_i = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho).

Upload: sum_i n_i (y_i - x_t) / a_i, then the scalar sum_i n_i a_i. Buffers (batch-norm statistics) are
not SGD iterates, so their part of the vector is averaged as FedAvg does.

Under client-level DP (privacy.mechanism: gaussian, which requires client.steps) every client runs the same
steps with the same momentum, so every a_i is one public number a and the update is
a * sum_i p_i (Delta_i / a) = sum_i p_i Delta_i: a cancels. It is then taken as 1, so that the noise on the
sum of clipped Delta_i keeps the scale the accountant charges (dividing by a first would multiply the
noise in the update by a), and tau_eff does not come from the reduced sum of a_i, which would reveal the
realized cohort size (docs/privacy.md).
"""

from dataclasses import dataclass

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg


def normalizer(steps, momentum=0.0):
    """a_i: the total weight local SGD with this momentum gives the client's gradients over `steps` steps."""
    rho = float(momentum)
    if rho == 0.0:
        return float(steps)
    return (steps - rho * (1.0 - rho ** steps) / (1.0 - rho)) / (1.0 - rho)


@dataclass(frozen=True)
class FedNovaKeys(AlgorithmKeys):
    name: str = "fednova"


@register
class FedNova(FedAvg):
    name = "fednova"
    robust_aggregation = False   # its own aggregate or upload: not a weighted mean of one vector
    uploads_model_delta = False  # its accumulate uploads more than the model's change
    Keys = FedNovaKeys
    up_scalars = 1      # sum_i n_i a_i, after the vector

    @classmethod
    def privacy_problems(cls, keys, client_steps):
        if client_steps is None:
            return ["with client.epochs the step count a_i depends on the client's sample count, which the "
                    "aggregation then reveals; set client.steps"]
        return []

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.equal_steps = context.privacy_enabled     # every a_i is the same public a (see the docstring)

    def accumulate(self, run, down, model, acc):
        dim, n = self.dim, self.n_params
        w = run.weight
        a_i = 1.0 if self.equal_steps else normalizer(run.steps, self.context.client.momentum)
        delta = model.vec - down[:dim]
        acc[:n].add_(delta[:n], alpha=w / a_i)     # -n_i d_i
        acc[n:dim].add_(delta[n:], alpha=w)
        acc[dim:dim + 1].add_(w * a_i)
        return w

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        n, dim = self.n_params, self.dim
        tau_eff = 1.0 if self.equal_steps else float(up_sum[dim]) / weight_sum
        update = up_sum[:dim] / weight_sum
        update[:n].mul_(tau_eff)
        return update
