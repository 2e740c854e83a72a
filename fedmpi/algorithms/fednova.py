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
realized cohort size (docs/how-to/privacy.md).

The sums do not depend on how the clients are grouped on ranks (the -n promise), as FedAvg's do not: there
each client's n_i Delta_i is a sample count times a float32 difference from x_t, a multiple of x_t's float32
spacing, so that the float64 sums over a rank's clients and over the ranks are exact. Dividing by a_i leaves
that grid (55 samples over 6 steps: the float64 n_i / a_i rounded each product in its own last bit, and -n 1
and -n 3 gave different models). So a_i is rounded to float32 (n_i a_i is then exact), and d_i is put back
on a grid: the float32 quotient (y_i - x_t) / a_i is added to x_t 2^-GRID_BITS and taken from it again in
float32, which rounds it to 2^-GRID_BITS of x_t's spacing, as y_i - x_t is rounded to that spacing itself.
That changes d_i by at most half the larger of 2^-GRID_BITS of x_t's spacing and d_i's own float32 spacing,
and x_{t+1} by tau_eff times that (where d_i is small beside x_t, less than one float32 step of x_t for
tau_eff up to 2^GRID_BITS), and takes about GRID_BITS - log2(a_i) bits of the float64 sums' margin. Where
an entry of x_t is 0 there is no grid, for FedAvg as here: the sums are exact where the clients' values
there are of like size.
"""

from dataclasses import dataclass

import numpy as np

from fedmpi.algorithms.base import AlgorithmKeys
from fedmpi.algorithms.catalog import register
from fedmpi.algorithms.fedavg import FedAvg

# d_i is rounded to 2^-GRID_BITS of x_t's float32 spacing (see the module's docstring).
GRID_BITS = 8
GRID_STEP = 2.0 ** -GRID_BITS


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
        a_i = 1.0 if self.equal_steps else float(np.float32(normalizer(run.steps, self.context.client.momentum)))
        delta = model.vec - down[:dim]
        if a_i != 1.0:      # (else d_i is Delta_i, on x_t's grid already: FedAvg's terms exactly)
            anchor = down[:n] * GRID_STEP       # x_t 2^-GRID_BITS (exact): its float32 spacing is the grid
            delta[:n].div_(a_i).add_(anchor).sub_(anchor)       # -d_i, rounded to that grid
        acc[:dim].add_(delta, alpha=w)      # -n_i d_i (n_i Delta_i for the buffers): exact in float64
        acc[dim:dim + 1].add_(w * a_i)      # a float32 times a sample count: exact too
        return w

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        n, dim = self.n_params, self.dim
        tau_eff = 1.0 if self.equal_steps else float(up_sum[dim]) / weight_sum
        update = up_sum[:dim] / weight_sum
        update[:n].mul_(tau_eff)
        return update
