"""Walk-through 5 of docs/how-to/own-algorithm.md: a server optimizer in one file, run by
`server.optimizer: examples.nesterov:Nesterov`.

Nesterov momentum on the server (the look-ahead form of Sutskever et al. 2013, as torch.optim.SGD with
nesterov=True applies it to the round's update u): m <- mu m + u, x <- x + lr (u + mu m). At mu = 0 it is
FedAvg's step, x + lr u.
"""

import torch

from fedmpi.algorithms.state import ServerVectors
from fedmpi.round.server_opt import ServerOptimizer


class Nesterov(ServerOptimizer):
    name = "nesterov"
    uses = ("momentum",)        # reads server.momentum; server.betas or server.tau set beside it are refused

    def __init__(self, server_cfg, dim, n_params):
        super().__init__(server_cfg, dim, n_params)
        # float64 on rank 0, saved in every checkpoint under /optimizer and checked on --resume
        self.moments = ServerVectors(dtype=torch.float64, m=n_params)

    def step(self, x, update, lr):
        mu, n = self.cfg.momentum, self.n_params
        m = self.moments.get("m", x.device)
        m.mul_(mu).add_(update[:n])
        # the trainable entries take the step; buffers (BatchNorm statistics) the plain average
        return self._apply(x, update, lr * (update[:n] + mu * m))
