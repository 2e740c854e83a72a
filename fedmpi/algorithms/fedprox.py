"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

Each client minimises its loss plus the proximal term mu/2 ||w - x_t||^2, which keeps the local model near
the round's global model. Its gradient mu (w - x_t) is added to the flat gradient after every backward
pass; the server rule is FedAvg's (x + eta_g * sum_i p_i Delta_i). With mu = 0 FedProx is FedAvg.
"""

from fedmpi.algorithms.base import Algorithm


class FedProx(Algorithm):
    name = "fedprox"

    def __init__(self, cfg, dim, n_params):
        super().__init__(cfg, dim, n_params)
        self.mu = float(self.keys.mu)
        self._mu_anchor = None   # mu * x_t over the trainable part, for the client being trained

    def client_start(self, run, down, model):
        super().client_start(run, down, model)
        # mu (w - x_t) = mu w - mu x_t: computing mu x_t once per client leaves two in-place operations
        # per step and no temporary the size of the model.
        self._mu_anchor = down[: self.n_params] * self.mu

    def grad_hook(self, params, grad):
        grad.add_(params, alpha=self.mu).sub_(self._mu_anchor)
