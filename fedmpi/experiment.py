"""One FL experiment: set-up on every rank, then the round loop (DESIGN §5).

Every rank runs the same `Experiment.run`; what a rank does in a round depends on its role. Rank 0 (the
server) fills the broadcast buffer and applies the server update; the ranks that host clients train them
and add their uploads into one accumulator; one `reduce_sum` brings the accumulators to rank 0. At
`-n 1` rank 0 does both. No random choice is communicated: every rank derives the round's clients and
each client's batches from the seed.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from fedmpi import rng
from fedmpi.algorithms import ClientRun, build_algorithm
from fedmpi.data import load_dataset
from fedmpi.data.partition import partition
from fedmpi.data.stats import partition_stats
from fedmpi.flat import FlatModel
from fedmpi.models import build_model
from fedmpi.runtime import pick_device, place_clients, set_threads
from fedmpi.train import LocalTrainer, Schedule, evaluate, schedule

# Broadcast header: [command, round]; workers check the round to catch ranks falling out of step.
HEADER = 2
CMD_RUN, CMD_STOP = 0.0, 1.0
# Scalars riding in the reduction after the upload vectors.
WEIGHT, LOSS, SEEN, UPLOADS = range(4)
N_STATS = 4


def build_partition(cfg, dataset):
    """(client index arrays, /partition datasets); the same on every rank."""
    parts = partition(dataset, cfg)
    return parts, partition_stats(dataset.y_train, parts, dataset.num_classes)


class Experiment:
    def __init__(self, cfg, comm):
        self.cfg, self.comm = cfg, comm
        local_rank, local_size, server_here = comm.node_local()
        computing = local_size - (1 if server_here and comm.size > 1 else 0)
        self.threads = set_threads(cfg.runtime.threads, computing)
        self.device = pick_device(cfg.runtime.device, local_rank)
        self.dataset = load_dataset(cfg)
        self.real_parts, self.stats = build_partition(cfg, self.dataset)
        self.real_sizes = np.array([len(p) for p in self.real_parts])

        rng.seed_torch(cfg.seed, rng.INIT)     # every rank builds the same initial model, on the CPU
        module = build_model(cfg.model, self.dataset.input_shape, self.dataset.num_classes)
        self.flat = FlatModel(module, self.device)
        self.algo = build_algorithm(cfg, self.flat.dim, self.flat.n_params)
        self.parts = self.algo.clients(self.real_parts)
        self.host = place_clients([len(p) for p in self.parts], comm.workers)
        self.mine = set(np.flatnonzero(self.host == comm.rank).tolist())
        self._place_data()
        self._make_buffers()
        self.x = self.flat.vec.clone() if comm.is_server else None
        self.start_round = 0

    # -- set-up ----------------------------------------------------------------------------------
    def _place_data(self):
        ds, dev = self.dataset, self.device
        if self.mine:
            self.x_train = torch.from_numpy(ds.x_train).to(dev)
            self.y_train = torch.from_numpy(ds.y_train).to(dev)
            self.client_idx = {c: torch.from_numpy(self.parts[c]).to(dev) for c in sorted(self.mine)}
            self.trainer = LocalTrainer(self.flat, self.cfg.client, self.x_train, self.y_train)
        if self.comm.is_server:
            self.x_test = torch.from_numpy(ds.x_test).to(dev)
            self.y_test = torch.from_numpy(ds.y_test).to(dev)

    def _make_buffers(self):
        dim, algo, n = self.flat.dim, self.algo, len(self.parts)
        pin = self.device.type == "cuda"
        self.up_len = algo.up_vectors * dim + algo.up_scalars
        self.down_host = torch.zeros(HEADER + algo.down_vectors * dim, dtype=torch.float32, pin_memory=pin)
        # Upload sums, the scalar stats, then one block of length n per per-client figure (local loss and
        # the algorithm's own `client_columns`), each client's value at its id and zeros elsewhere.
        # Sums are float64 so that their value does not depend on how clients are spread over ranks
        # (float32 addition is not associative); what a real client would send is still float32.
        self.columns = ("loss",) + tuple(algo.client_columns)
        self.up_host = torch.zeros(self.up_len + N_STATS + len(self.columns) * n, dtype=torch.float64,
                                   pin_memory=pin)
        self.down_np, self.up_np = self.down_host.numpy(), self.up_host.numpy()
        self.acc = torch.zeros(self.up_len, dtype=torch.float64, device=self.device)

    # -- one round -------------------------------------------------------------------------------
    def selection(self, t):
        cfg = self.cfg
        standard = rng.select_clients(cfg.seed, t, cfg.partition.clients, cfg.server.clients_per_round)
        return standard, self.algo.select(t, standard, self.real_sizes)

    def broadcast(self, t, command=CMD_RUN):
        if self.comm.is_server:
            self.down_np[0], self.down_np[1] = command, t
            payload = self.down_host[HEADER:]
            if self.device.type == "cuda":
                staged = torch.empty_like(payload, device=self.device)
                self.algo.down_payload(self.x, staged)
                payload.copy_(staged)
            else:
                self.algo.down_payload(self.x, payload)
        self.comm.bcast(self.down_np)
        if self.down_np[0] == CMD_RUN and int(self.down_np[1]) != t:
            raise RuntimeError(f"rank {self.comm.rank} expected round {t}, server broadcast round "
                               f"{int(self.down_np[1])}: ranks out of step")
        return self.down_np[0]

    def train_clients(self, t, standard, selected):
        """Trains the selected clients hosted here; fills `up_host` with this rank's contribution."""
        cfg, algo, flat = self.cfg, self.algo, self.flat
        self.up_host.zero_()
        self.acc.zero_()
        down = self.down_host[HEADER:].to(self.device, non_blocking=True)
        weight, seen, uploads = 0.0, 0, 0
        loss_total = torch.zeros((), device=self.device)
        columns = self.client_figures(self.up_host)
        for cid in (int(c) for c in selected):
            if cid not in self.mine:
                continue
            run = ClientRun(cid, t, len(self.parts[cid]))
            custom = algo.schedule(cid, self.real_sizes, standard)
            sched = Schedule(*custom) if custom else schedule(cfg.client, run.n_samples)
            algo.client_start(run, down, flat)
            rng.seed_torch(cfg.seed, rng.CLIENT, t, cid, 1)
            loss_sum, n_seen = self.trainer.train(self.client_idx[cid], rng.stream(cfg.seed, rng.CLIENT, t, cid),
                                                  sched, grad_hook=algo.grad_hook, loss_fn=algo.loss_fn)
            run.steps, run.loss_sum = sched.steps, loss_sum
            weight += algo.accumulate(run, down, flat, self.acc)
            uploads += 1
            seen += n_seen
            loss_total += loss_sum
            run.figures["loss"] = float(loss_sum) / max(n_seen, 1)
            for name, value in run.figures.items():
                columns[name][cid] = value
        self.up_host[: self.up_len].copy_(self.acc)
        stats = self.up_host[self.up_len: self.up_len + N_STATS]
        stats[WEIGHT], stats[LOSS], stats[SEEN], stats[UPLOADS] = weight, float(loss_total), seen, uploads

    def server_step(self, t, selected):
        """Applies the server update from the reduced `up_host`; returns the round's figures."""
        stats = self.up_np[self.up_len: self.up_len + N_STATS].astype(np.float64)
        up_sum = self.up_host[: self.up_len].to(self.device)
        self.x = self.algo.server_update(self.x, up_sum, float(stats[WEIGHT]), t)
        clients = {"selected": np.isin(np.arange(len(self.parts)), selected).astype(np.float32)}
        for name, column in self.client_figures(self.up_np).items():
            clients[name] = np.full(len(self.parts), np.nan, dtype=np.float32)
            clients[name][selected] = column[selected]
        dim_bytes = 4 * self.flat.dim
        return {
            "round": t,
            "train_loss": stats[LOSS] / stats[SEEN] if stats[SEEN] else np.nan,
            "uploads": stats[UPLOADS],
            "bytes_up": stats[UPLOADS] * self.algo.up_vectors * dim_bytes,
            "bytes_down": len(selected) * self.algo.down_vectors * dim_bytes,
        }, clients

    def client_figures(self, buf):
        """Views of the per-client blocks of the upload buffer, by figure name."""
        n, start = len(self.parts), self.up_len + N_STATS
        return {name: buf[start + i * n: start + (i + 1) * n] for i, name in enumerate(self.columns)}

    def evaluate(self):
        self.flat.load(self.x)
        return evaluate(self.flat.module, self.x_test, self.y_test, self.cfg.eval.batch_size)

    def eval_due(self, t):
        return (t + 1) % self.cfg.eval.every == 0 or t + 1 == self.cfg.rounds

    def run_round(self, t):
        """One round on this rank; on the server returns (metrics, per-client figures)."""
        _inject_fault(self.comm.rank, t)
        standard, selected = self.selection(t)
        self.broadcast(t)
        if self.mine:
            self.train_clients(t, standard, selected)
        else:
            self.up_host.zero_()
        self.comm.reduce_sum(self.up_np)
        if not self.comm.is_server:
            return None
        metrics, clients = self.server_step(t, selected)
        if self.eval_due(t):
            metrics["test_acc"], metrics["test_loss"] = self.evaluate()
        return metrics, clients


def _inject_fault(rank, t):
    """Test aid: FEDMPI_INJECT_FAULT="RANK:ROUND" raises on that rank at the start of that round, so the
    failure path (one rank fails, the whole job ends, run.h5 says failed) can be exercised for real."""
    spec = os.environ.get("FEDMPI_INJECT_FAULT")
    if spec and spec == f"{rank}:{t}":
        raise RuntimeError(f"injected fault (FEDMPI_INJECT_FAULT={spec})")
