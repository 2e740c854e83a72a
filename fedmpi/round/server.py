"""Rank 0's part of a round: the global model, the server optimizer, evaluation and the round's figures.

After the reduction the server asks the algorithm for the round's update (`aggregate`), lets the server
optimizer apply it (`server.optimizer` under `server.lr_schedule`; algorithms that declare
`uses_server_optimizer = False` are applied as x + update), gives the algorithm its `after_step` (FSL's
server learning) and assembles the row of /metrics and /clients. (Evaluation is split across every rank:
fedmpi.round.evaluation.)
"""

from __future__ import annotations

import numpy as np
import torch

from fedmpi.core.schedules import LearningRate
from fedmpi.round.server_opt import build_optimizer
from fedmpi.uploads.precision import itemsize


class Server:
    def __init__(self, algo, flat, x0, *, server, rounds, client_rate, wire_dtype):
        """`server`: the `server` section (its optimizer, and eta_g under server.lr_schedule over the run's
        `rounds`: the server optimizer's step, built here, its one user); `client_rate`: eta_l under
        client.lr_schedule, the clients' (schedules.LearningRate), logged each round; `wire_dtype`:
        runtime.wire_dtype (what an entry costs on the wire)."""
        self.algo, self.flat = algo, flat
        self.client_rate, self.server_rate = client_rate, LearningRate.of(server, rounds)
        self.wire_dtype = wire_dtype
        self.x = x0.to(flat.device, copy=True)     # its own memory: the server optimizer may update it in place
        self.optimizer = build_optimizer(server, flat.dim, flat.n_params)

    def start(self, server_trainer):
        """x_0: the algorithm's pretraining or warm-up on the server's set where it has one."""
        if server_trainer is not None:
            self.x = self.algo.initial_model(self.x, server_trainer)

    def fill_down(self, out):
        self.algo.down_payload(self.x, out)

    def apply(self, t, sums, weight):
        """The server update of round t from the reduced upload sums and their total weight."""
        if self.algo.update_is_the_mean:
            # The optimizer takes the mean itself (server SGD on the CPU: x += float32(lr * sums / weight) in one
            # blocked pass, without the model-sized mean and step, 12 bytes per parameter on rank 0); the same
            # operations on every entry as aggregate then step, so the same bits (tests/test_server_opt.py).
            if weight > 0:      # (nobody uploaded: FedAvg's aggregate is None, x stays)
                self.x = self.optimizer.step_on_mean(self.x, sums[: self.flat.dim], weight, self.server_rate.at(t))
            return
        update = self.algo.aggregate(self.x, sums, weight, t)
        if update is not None and self.algo.split is not None:
            # Personal entries never change on the server (upload stages' noise included): x_0's stay there.
            update = self.algo.split.put_personal(update, torch.zeros(self.algo.split.personal_dim, dtype=update.dtype,
                                                                         device=update.device))
        if update is not None:
            if self.algo.uses_server_optimizer:
                self.x = self.optimizer.step(self.x, update, self.server_rate.at(t))
            else:
                self.x = self.x + update.to(self.x.dtype)
        self.x = self.algo.after_step(self.x, t)

    def figures(self, t, selected, stats, client_figures, num_clients):
        """The round's /metrics row (without evaluation) and /clients rows."""
        clients = {"selected": np.isin(np.arange(num_clients), selected).astype(np.float32)}
        for name, column in client_figures.items():
            clients[name] = np.full(num_clients, np.nan, dtype=np.float32)
            clients[name][selected] = column[selected]
        # Personal entries are not sent (all of dim without them); the payload at the wire dtype's width.
        dim_bytes = itemsize(self.wire_dtype) * self.algo.wire_dim
        metrics = {
            "round": t,
            "train_loss": stats.loss / stats.seen if stats.seen else np.nan,
            "uploads": stats.uploads,
            "bytes_up": stats.bytes_up,
            "bytes_down": len(selected) * self.algo.down_vectors * dim_bytes,
            "client_lr": self.client_rate.at(t),
            "server_lr": self.server_rate.at(t),
        }
        return metrics, clients

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything rank 0 holds that a resumed run needs: the global model, the algorithm's server state
        and the optimizer's moments."""
        return {"global": self.x.detach().cpu().numpy(), "server": self.algo.server_state(),
                "optimizer": self.optimizer.state()}

    def load_state_dict(self, state: dict):
        self.x = torch.from_numpy(np.asarray(state["global"], dtype=np.float32)).to(self.flat.device)
        self.algo.load_server_state(state.get("server", {}))
        self.optimizer.load_state(state.get("optimizer", {}))
