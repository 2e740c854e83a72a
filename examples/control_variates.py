"""Control variates: a SCAFFOLD-like stateful algorithm (Karimireddy et al., "SCAFFOLD", ICML 2020,
option II), written from scratch in one file.

    export PYTHONPATH=$PWD      # in the repository root: every rank must be able to import `examples`
    mpiexec -n 3 fedmpi run jobs/configs/quickstart.yaml algorithm.name=examples.control_variates:ControlVariates

Every client i keeps a control c_i (a `ClientVectors`, on the rank that hosts the client) and the server a
control c (a `ServerVectors`, on rank 0); checkpoints save both and --resume restores them, with no code
here. Two vectors travel each way:
    down  x_t and c
    up    n_i (y_i - x_t) and Delta c_i = c_i+ - c_i
Local steps use the corrected gradient g - c_i + c; after training c_i+ = c_i - c + (x_t - y_i) / (K eta_l)
(K local steps, eta_l the round's client learning rate). The server moves x by sum_i p_i (y_i - x_t) (through
`server.optimizer`) and c by (1/N) sum_i Delta c_i. fedmpi's own `scaffold` is this rule; this file shows
how an algorithm keeps state on both sides.
"""

from dataclasses import dataclass

from fedmpi.algorithms.base import AlgorithmKeys, Reduce, weighted_mean_update
from fedmpi.algorithms.state import ClientVectors, ServerVectors


@dataclass(frozen=True)
class ControlVariatesKeys(AlgorithmKeys):
    name: str = "control_variates"


class ControlVariates(Reduce):
    name = "control_variates"
    Keys = ControlVariatesKeys
    keeps_client_state = True   # c_i stays with its client: clients train on their fixed host rank
    down_vectors = 2            # x_t, c
    up_vectors = 2              # n_i (y_i - x_t), Delta c_i

    def __init__(self, keys, context):
        super().__init__(keys, context)
        self.num_clients = context.num_clients            # N, from the run's context (not the config)
        self.server_control = ServerVectors(c=self.n_params)   # c (trainable entries only: buffers have no gradient)
        self.client_controls = ClientVectors("c_i")      # c_i; a client without one has c_i = 0
        self._correction = None                          # c - c_i of the client being trained

    # -- server (rank 0) --------------------------------------------------------------------------------
    def down_payload(self, x, out):
        dim, n = self.dim, self.n_params
        out[:dim].copy_(x)
        out[dim:dim + n].copy_(self.server_control.get("c", x.device))
        out[dim + n:].zero_()

    def aggregate(self, x, up_sum, weight_sum, round_):
        if weight_sum <= 0:
            return None
        dim, n = self.dim, self.n_params
        c = self.server_control.get("c", x.device)
        c.add_((up_sum[dim:dim + n] / self.num_clients).to(c.dtype))
        return weighted_mean_update(up_sum, weight_sum, dim)

    # -- client (the rank hosting it) -------------------------------------------------------------------
    def client_start(self, run, down, model):
        model.load(down[: self.dim])
        c = down[self.dim:self.dim + self.n_params]
        self._correction = c - self.client_controls.or_zeros(run.cid, self.n_params, model.device)

    def grad_hook(self, params, grad):
        grad.add_(self._correction)     # g - c_i + c, in place on the flat gradient

    def accumulate(self, run, down, model, acc):
        dim, n = self.dim, self.n_params
        delta = model.vec - down[:dim]
        acc[:dim].add_(delta, alpha=run.weight)
        c, c_i = down[dim:dim + n], self.client_controls.or_zeros(run.cid, n, model.device)
        c_new = c_i - c - delta[:n] / (run.steps * run.lr)
        acc[dim:dim + n].add_(c_new - c_i)
        self.client_controls[run.cid] = c_new
        return run.weight
