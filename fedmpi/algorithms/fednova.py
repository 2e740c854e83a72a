"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020).

Clients that run different numbers of local steps pull FedAvg's average toward the busier ones. FedNova
divides each client's update by its normaliser a_i, d_i = (x_t - y_i) / a_i, and rescales the average by
the effective step count: x_{t+1} = x_t - eta_g * (sum_i p_i a_i) * sum_i p_i d_i, p_i = n_i / sum_j n_j
over the round's clients. eta_g (server.lr, default 1.0) generalises the paper's rule as for FedAvg.

a_i is the number of local steps tau for plain SGD. With momentum rho (torch's SGD: buf = rho buf + g,
w -= lr buf) the k-th gradient moves w by lr (1 - rho^(tau-k)) / (1 - rho) in total, and summing over
k gives a_i = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho).

Upload: sum_i n_i (y_i - x_t) / a_i, then the scalar sum_i n_i a_i. Buffers (batch-norm statistics) are
not SGD iterates, so their part of the vector is averaged as FedAvg does.
"""

from fedmpi.algorithms.base import Algorithm


def normalizer(steps, momentum=0.0):
    """a_i: the total weight local SGD with this momentum gives the client's gradients over `steps` steps."""
    rho = float(momentum)
    if rho == 0.0:
        return float(steps)
    return (steps - rho * (1.0 - rho ** steps) / (1.0 - rho)) / (1.0 - rho)


class FedNova(Algorithm):
    name = "fednova"
    up_scalars = 1      # sum_i n_i a_i, after the vector

    def accumulate(self, run, down, model, acc):
        dim, n = self.dim, self.n_params
        w = float(run.n_samples)
        a_i = normalizer(run.steps, self.cfg.client.momentum)
        delta = model.vec - down[:dim]
        acc[:n].add_(delta[:n], alpha=w / a_i)     # -n_i d_i
        acc[n:dim].add_(delta[n:], alpha=w)
        acc[dim:dim + 1].add_(w * a_i)
        return w

    def server_update(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return x
        n, dim = self.n_params, self.dim
        tau_eff = float(up_sum[dim]) / weight_sum
        step = up_sum[:dim] * (self.cfg.server.lr / weight_sum)
        step[:n].mul_(tau_eff)
        return x + step.to(x.dtype)
