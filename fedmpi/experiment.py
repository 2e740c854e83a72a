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

from fedmpi import rng, signals, vectorized
from fedmpi.algorithms import ClientRun, build_algorithm
from fedmpi.data import load_dataset
from fedmpi.data.augment import make_transform
from fedmpi.data.server_set import split_dataset
from fedmpi.data.stats import partition_stats
from fedmpi.flat import FlatModel
from fedmpi.models import build_model
from fedmpi.rounds import ROUNDS, RoundTally
from fedmpi.runtime import pick_device, place_clients, set_threads
from fedmpi.train import LocalTrainer, Schedule, ServerTrainer, evaluate, schedule, seed_torch_on

# Broadcast header: [command, round]; workers check the round to catch ranks falling out of step.
HEADER = 2
CMD_RUN, CMD_STOP = 0.0, 1.0
# Scalars riding in the reduction after the upload vectors. STOP counts the ranks that received a stop
# signal (fedmpi.signals): the request reaches the server without a collective of its own.
WEIGHT, LOSS, SEEN, UPLOADS, STOP = range(5)
N_STATS = 5
# Test aid: with runtime.cuda_aware_mpi, exercise the device-buffer path on a CPU device when this is set.
DEVICE_MPI_TEST = "FEDMPI_TEST_DEVICE_MPI"


def build_partition(cfg, dataset):
    """The server's set and the clients' index arrays, with their statistics for the run file under the
    group paths `partition` and `partition/server` (a `Split`); the same on every rank."""
    return split_dataset(cfg, dataset)


class Experiment:
    def __init__(self, cfg, comm):
        self.cfg, self.comm = cfg, comm
        local_rank, local_size, server_here = comm.node_local()
        computing = local_size - (1 if server_here and comm.size > 1 else 0)
        self.threads = set_threads(cfg.runtime.threads, computing)
        self.device = pick_device(cfg.runtime.device, local_rank)
        self.dataset = load_dataset(cfg)
        self.split = build_partition(cfg, self.dataset)
        self.real_parts, self.stats = self.split.parts, self.split.groups["partition"]
        # The server's set (D0 for FSL, G for data sharing, SAFL's probe set) as indices into x_train; empty
        # when server_data.size is 0. With source holdout the clients' pool (`split.pool`) excludes it.
        self.server_idx = self.split.server_idx
        self.real_sizes = np.array([len(p) for p in self.real_parts])

        rng.seed_torch(cfg.seed, rng.INIT)     # every rank builds the same initial model, on the CPU
        module = build_model(cfg.model, self.dataset.input_shape, self.dataset.num_classes)
        self.flat = FlatModel(module, self.device)
        self.algo = build_algorithm(cfg, self.flat.dim, self.flat.n_params)
        self.algo.setup(self.real_sizes, self.server_idx, self.flat.vec.clone())
        self.parts = self.algo.clients(self.real_parts)
        if self.algo.shares_data:
            self.split.groups["partition/shared"] = partition_stats(self.dataset.y_train, self.parts,
                                                                   self.dataset.num_classes)
        self.host = place_clients([len(p) for p in self.parts], comm.workers)
        self.mine = set(np.flatnonzero(self.host == comm.rank).tolist())
        # Clients that keep nothing between rounds need not train on their host: each round the selected
        # clients are dealt to the workers by the same largest-first rule (`round_clients`), so every worker
        # gets an equal share of every draw (a fixed placement splits W1's 10 of 50 clients 6/4 on average).
        self.balanced = len(comm.workers) > 1 and self.algo.movable_clients()
        self.trains = bool(self.mine) or (self.balanced and comm.rank in comm.workers)
        self._place_data()
        self._plan_vectorize()
        self._make_buffers()
        self.x = self.flat.vec.clone() if comm.is_server else None
        self._attach_algorithm_data()
        self.start_round = 0
        # Stop requests: `stop_votes` (server) is the round's count of ranks asking to stop; once the
        # run loop sets `stopping`, the next broadcast carries CMD_STOP instead of starting that round.
        self.stop_votes, self.stopping = 0, False

    # -- set-up ----------------------------------------------------------------------------------
    def _place_data(self):
        ds, dev = self.dataset, self.device
        if self.trains or (self.comm.is_server and len(self.server_idx)):
            self.x_train = torch.from_numpy(ds.x_train).to(dev)
            self.y_train = torch.from_numpy(ds.y_train).to(dev)
        if self.trains:
            trainable = range(len(self.parts)) if self.balanced else sorted(self.mine)
            self.client_idx = {c: torch.from_numpy(self.parts[c]).to(dev) for c in trainable}
            self.trainer = LocalTrainer(self.flat, self.cfg.client, self.x_train, self.y_train,
                                        transform=make_transform(self.cfg.data, ds.input_shape))
        if self.comm.is_server:
            self.x_test = torch.from_numpy(ds.x_test).to(dev)
            self.y_test = torch.from_numpy(ds.y_test).to(dev)

    def _plan_vectorize(self):
        """`client.vectorize`: off, or auto/on when the algorithm and the model allow batched groups
        (fedmpi.vectorized); `on` with an algorithm or model that cannot fails here, on every rank."""
        mode, self.group_trainer = self.cfg.client.vectorize, None
        if mode == "off":
            return
        blocker = self.algo.vectorize_blocker() or vectorized.unsupported(self.flat)
        if blocker:
            if mode == "on":
                from fedmpi.errors import ConfigError

                raise ConfigError(f"client.vectorize = 'on': {blocker}; use auto (batch clients where "
                                  f"possible) or off")
            return
        if self.trains and (mode == "on" or vectorized.worthwhile(self.flat)):
            self.group_trainer = vectorized.GroupTrainer(self.flat, self.cfg.client, self.x_train, self.y_train,
                                                         transform=self.trainer.transform)

    def _attach_algorithm_data(self):
        """Server-side training data (FSL's D0, data sharing's G) and SAFL's probe evaluation."""
        algo = self.algo
        if self.comm.is_server and algo.uses_server_set and len(self.server_idx):
            idx = torch.from_numpy(self.server_idx).to(self.device)
            trainer = ServerTrainer(self.flat, self.cfg.client, self.x_train, self.y_train, idx, self.cfg.seed)
            self.x = algo.initial_model(self.x, trainer)
        if self.mine and hasattr(algo, "attach_probe"):
            algo.attach_probe(self.accuracy_on_train)

    def accuracy_on_train(self, vec, indices):
        """Accuracy of model `vec` on training samples `indices` (SAFL's probe sets); loads `vec`."""
        self.flat.load(vec)
        idx = torch.from_numpy(np.asarray(indices)).to(self.device)
        acc, _ = evaluate(self.flat.module, self.x_train[idx], self.y_train[idx], self.cfg.eval.batch_size)
        return acc

    @property
    def first_round(self):
        """The first round this process runs (0, or the round after the checkpoint it resumed from)."""
        return self.start_round

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
        # On a GPU each direction also has one device buffer, made here once: the broadcast payload is
        # staged through the pinned host buffer into `down_dev` and the reduced sums from `up_host` into
        # `up_dev`, with no allocation per round. With runtime.cuda_aware_mpi the device buffers go to MPI
        # themselves (mpi4py reads __cuda_array_interface__) and the host copies of the vectors are skipped.
        self.device_mpi = self.cfg.runtime.cuda_aware_mpi and (pin or bool(os.environ.get(DEVICE_MPI_TEST)))
        staged = pin or self.device_mpi
        self.down_dev = torch.zeros_like(self.down_host, device=self.device) if staged else None
        self.up_dev = torch.zeros_like(self.up_host, device=self.device) if staged else None
        self.sums_on_device = False     # the last reduction left the summed vectors in up_dev (device MPI)

    # -- one round -------------------------------------------------------------------------------
    def selection(self, t):
        cfg = self.cfg
        standard = rng.select_clients(cfg.seed, t, cfg.partition.clients, cfg.server.clients_per_round)
        return standard, self.algo.select(t, standard, self.real_sizes)

    def broadcast(self, t, command=CMD_RUN, full=True):
        """Rank 0's header and (if `full`) down payload to every rank; returns the command.

        FedSkip's rounds inside a period send the header alone: the slots, not x, carry the model."""
        if self.comm.is_server:
            self.down_np[0], self.down_np[1] = (CMD_STOP if self.stopping else command), t
            payload = self.down_host[HEADER:]
            if full and self.down_dev is not None:
                self.algo.down_payload(self.x, self.down_dev[HEADER:])
                if not self.device_mpi:
                    payload.copy_(self.down_dev[HEADER:])
            elif full:
                self.algo.down_payload(self.x, payload)
        if self.device_mpi:
            self.down_dev[:HEADER].copy_(self.down_host[:HEADER])
            self._device_ready()
            self.comm.bcast(_wire(self.down_dev if full else self.down_dev[:HEADER]))
            self.down_host[:HEADER].copy_(self.down_dev[:HEADER])     # the command and round, checked below
        else:
            self.comm.bcast(self.down_np if full else self.down_np[:HEADER])
        if self.down_np[0] == CMD_RUN and int(self.down_np[1]) != t:
            raise RuntimeError(f"rank {self.comm.rank} expected round {t}, server broadcast round "
                               f"{int(self.down_np[1])}: ranks out of step")
        if self.down_np[0] == CMD_STOP:     # every rank leaves here, before round t does anything
            raise signals.stop_error(int(self.down_np[1]), self.stop_votes or None)
        return self.down_np[0]

    def down_vector(self):
        """The broadcast payload on this rank's device (on the CPU, the host buffer itself)."""
        if self.down_dev is None:
            return self.down_host[HEADER:]
        if not self.device_mpi:
            self.down_dev[HEADER:].copy_(self.down_host[HEADER:], non_blocking=True)
        return self.down_dev[HEADER:]

    def begin_tally(self):
        """Clears this rank's contribution to the round's reduction."""
        self.up_host.zero_()
        self.acc.zero_()
        self.tally = RoundTally(torch.zeros((), device=self.device), self.client_figures(self.up_host))

    def train_client(self, t, cid, standard, load_start):
        """Trains client `cid` from the start point that `load_start(run)` puts into the model; tallies its
        loss. The result is in `self.flat.vec`."""
        cfg, algo = self.cfg, self.algo
        run = ClientRun(cid, t, len(self.parts[cid]))
        custom = algo.schedule(cid, self.real_sizes, standard)
        sched = Schedule(*custom) if custom else schedule(cfg.client, run.n_samples)
        load_start(run)
        seed_torch_on(self.device, cfg.seed, rng.CLIENT, t, cid, 1)
        loss_sum, n_seen = self.trainer.train(self.client_idx[cid], rng.stream(cfg.seed, rng.CLIENT, t, cid),
                                              sched, grad_hook=algo.grad_hook, loss_fn=algo.loss_fn)
        run.steps, run.loss_sum = sched.steps, loss_sum
        run.figures["loss"] = float(loss_sum) / max(n_seen, 1)
        self.tally.loss += loss_sum
        self.tally.seen += n_seen
        return run

    def round_clients(self, selected):
        """This rank's clients among the round's `selected`, in increasing id: its hosted ones, or with
        `balanced` its share of a largest-first deal of the selected clients (the same on every rank)."""
        if not self.balanced:
            return [int(c) for c in selected if int(c) in self.mine]
        share = place_clients([len(self.parts[c]) for c in selected], self.comm.workers)
        return [int(c) for c, rank in zip(selected, share) if rank == self.comm.rank]

    def train_hosted(self, t, cids, standard, down, load_start):
        """Trains the hosted clients `cids` of round t, batched groups first (`client.vectorize`), then the
        rest one by one; yields each client's ClientRun with its result in `self.flat.vec`."""
        groups, rest = self._vector_groups(t, cids, standard)
        for runs, sched in groups:
            yield from self._train_group(t, runs, sched, down)
        for cid in rest:
            yield self.train_client(t, cid, standard, load_start)

    def _schedule_of(self, run, standard):
        custom = self.algo.schedule(run.cid, self.real_sizes, standard)
        return Schedule(*custom) if custom else schedule(self.cfg.client, run.n_samples)

    def _vector_groups(self, t, cids, standard):
        """([(runs, schedule)] trained as batched groups, [client ids] for the per-client loop)."""
        if self.group_trainer is None or (self.cfg.client.vectorize == "auto" and len(cids) < vectorized.MIN_GROUP):
            return [], list(cids)
        by_key = {}
        for cid in cids:
            run = ClientRun(cid, t, len(self.parts[cid]))
            sched = self._schedule_of(run, standard)
            by_key.setdefault(vectorized.group_key(run.n_samples, sched), (sched, []))[1].append(run)
        groups, rest = [], []
        for sched, runs in by_key.values():
            if self.cfg.client.vectorize == "auto" and len(runs) < vectorized.MIN_GROUP:
                rest.extend(run.cid for run in runs)
                continue
            groups.extend((chunk, sched) for chunk in vectorized.chunks(runs, self.group_trainer.max_group))
        return groups, sorted(rest)

    def _train_group(self, t, runs, sched, down):
        """One batched group from the broadcast vector (client_start = load it; see vectorize_blocker)."""
        seed = self.cfg.seed
        clients = [(self.parts[run.cid], rng.stream(seed, rng.CLIENT, t, run.cid)) for run in runs]
        weights, loss_sums, seen = self.group_trainer.train(down, clients, sched)
        losses = loss_sums.tolist()
        for i, run in enumerate(runs):
            run.steps, run.loss_sum = sched.steps, loss_sums[i]
            run.figures["loss"] = losses[i] / max(seen, 1)
            self.tally.loss += loss_sums[i]
            self.tally.seen += seen
            self.flat.vec.copy_(weights[i])
            yield run

    def end_tally(self):
        """Writes this rank's sums, stats and per-client figures into `up_host`."""
        tally = self.tally
        (self.up_dev if self.device_mpi else self.up_host)[: self.up_len].copy_(self.acc)
        stats = self.up_host[self.up_len: self.up_len + N_STATS]
        stats[WEIGHT], stats[LOSS], stats[SEEN], stats[UPLOADS] = (tally.weight, float(tally.loss), tally.seen,
                                                                  tally.uploads)
        stats[STOP] = float(signals.requested())

    def reduce_up(self, sums=True):
        """The round's one reduction of `up_host` to rank 0; `sums=False` reduces only the statistics and
        per-client figures after the sums (FedSkip inside a period; gated SAFL, whose vectors travel by
        `masked_gather`). With device MPI the sums travel from `up_dev` and stay there on rank 0."""
        if not self.device_mpi:
            self.comm.reduce_sum(self.up_np if sums else self.up_np[self.up_len:])
            self.sums_on_device = False
            return
        tail = slice(self.up_len, None)
        self.up_dev[tail].copy_(self.up_host[tail])
        self._device_ready()
        self.comm.reduce_sum(_wire(self.up_dev if sums else self.up_dev[tail]))
        if self.comm.is_server:
            self.up_host[tail].copy_(self.up_dev[tail])
        self.sums_on_device = sums

    def _device_ready(self):
        """MPI reads device buffers outside torch's stream order: finish the kernels that fill them."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def up_sums(self):
        """Server: the reduced sums on this rank's device."""
        if self.sums_on_device:
            return self.up_dev[: self.up_len]
        if self.up_dev is None:
            return self.up_host[: self.up_len]
        self.up_dev[: self.up_len].copy_(self.up_host[: self.up_len], non_blocking=True)
        return self.up_dev[: self.up_len]

    def set_weight(self, weight):
        """Server: the total upload weight, when the sums arrived other than by the reduction."""
        self.up_np[self.up_len + WEIGHT] = weight

    def finish_round(self, t, selected, update=True, evaluate=None):
        """Server: update (unless a FedSkip round inside a period), evaluate when due, return the figures."""
        metrics, clients = self.server_step(t, selected, update)
        if self.eval_due(t) if evaluate is None else evaluate:
            metrics["test_acc"], metrics["test_loss"] = self.evaluate()
        metrics.update(self.algo.round_metrics())
        return metrics, clients

    def server_step(self, t, selected, update=True):
        """Applies the server update from the reduced `up_host`; returns the round's figures."""
        stats = self.up_np[self.up_len: self.up_len + N_STATS].astype(np.float64)
        self.stop_votes = int(stats[STOP])
        if update:
            up_sum = self.up_sums()
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
        return ROUNDS[self.algo.protocol](self, t)


def _wire(tensor):
    """What the communicator moves for a tensor: a numpy view on the CPU, the tensor itself on a GPU."""
    return tensor.numpy() if tensor.device.type == "cpu" else tensor


def _inject_fault(rank, t):
    """Test aid: FEDMPI_INJECT_FAULT="RANK:ROUND" raises on that rank at the start of that round, so the
    failure path (one rank fails, the whole job ends, run.h5 says failed) can be exercised for real."""
    spec = os.environ.get("FEDMPI_INJECT_FAULT")
    if spec and spec == f"{rank}:{t}":
        raise RuntimeError(f"injected fault (FEDMPI_INJECT_FAULT={spec})")
    # Test aid: FEDMPI_ROUND_DELAY_S=SECONDS sleeps at the start of every round, so that a test can signal
    # or kill a rank mid-run without heavy training; results do not change (wall_s aside).
    delay = os.environ.get("FEDMPI_ROUND_DELAY_S")
    if delay:
        time.sleep(float(delay))
