"""The clients a rank trains: where each client lives, its data on the rank's device, and local training.

Placement: clients go to worker ranks largest first onto the least-loaded worker (`runtime.place_clients`),
the same on every rank. Clients that keep nothing between rounds (the REDUCE protocol, no client state)
need not train on their host: each round the selected clients are dealt to the workers afresh (a fixed
placement splits W1's 10 of 50 clients 6/4 on average): under the plain reduction, where clients train one
by one on one node, to whichever worker is free (`runtime.client_dealing: auto`, DealtClients over
fedmpi.mpi.tickets), else in fixed shares by the same largest-first rule, equal in samples.

Training: a client copies the start point into the rank's one FlatModel, trains with its own stream
(seed, CLIENT, round, client) and leaves its result in `flat.vec`; where the algorithm and the model allow
(`client.vectorize`), a round's clients of one batch pattern train as one batched computation instead
(fedmpi.core.vectorized), with the same batches.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from fedmpi.algorithms.base import REDUCE, ClientRun
from fedmpi.core import rng, vectorized
from fedmpi.core.train import LocalTrainer, Schedule, evaluate, schedule, seed_torch_on
from fedmpi.data.augment import make_transform
from fedmpi.mpi.runtime import place_clients
from fedmpi.round.local_passes import LocalPasses


class ClientIndex:
    """client id -> its sample indices as a tensor on the device: made when first asked for, and kept only on
    a GPU (on the CPU it is a view of the index array, and keeping 100,000 of them costs memory for nothing)."""

    def __init__(self, parts, device):
        self.parts, self.device, self.kept = parts, device, {}

    def __getitem__(self, cid):
        idx = self.kept.get(cid)
        if idx is None:
            idx = torch.from_numpy(self.parts[cid]).to(self.device)
            if self.device.type != "cpu":
                self.kept[cid] = idx
        return idx


def _slow_clients_delay(rank):
    """Test aid: FEDMPI_TEST_SLOW_CLIENTS="RANK:SECONDS" makes that rank sleep before each client it trains
    one by one (a slow worker, to see the dealing follow who is free); results do not change."""
    spec = os.environ.get("FEDMPI_TEST_SLOW_CLIENTS", "")
    who, _, seconds = spec.partition(":")
    return float(seconds) if spec and int(who) == rank else 0.0


def deal_order(selected, sizes) -> list:
    """The order in which a round's clients are dealt to free workers: largest first (ties: lowest id), so
    that the last ones handed out, which decide who finishes last, are the smallest."""
    return sorted((int(c) for c in selected), key=lambda c: (-int(sizes[c]), c))


class DealtClients:
    """A rank's clients of a round dealt as the workers become free: iterating takes a ticket per client
    (ticket k is `order[k]`) until the tickets run past the round's clients. Iterable once; `taken` lists
    this rank's clients in the order taken."""

    def __init__(self, order, tickets):
        self.order, self.tickets, self.taken = order, tickets, None

    def __bool__(self):
        return bool(self.order)     # there may be clients to take (whether this rank gets one is known after)

    def __iter__(self):
        if self.taken is not None:
            raise RuntimeError("DealtClients: iterated twice (every ticket taken is a client trained here)")
        self.taken = []
        while (k := self.tickets.take()) < len(self.order):
            self.taken.append(self.order[k])
            yield self.order[k]


class ClientHost:
    def __init__(self, comm, workers, algo, flat, parts, device_data, *, seed, client, client_rate, data, server,
                 client_dealing, eval_batch, loss=None, keeps_state=False, poison=None):
        """`workers`: the ranks that train clients; `device_data` holds the data set and moves its tensors to the
        device on first use (DeviceData); `keeps_state`: an upload stage keeps per-client state or clients have
        personal parameters (clients then train on their host); `poison`: the data attack
        (fedmpi.attacks.data.DataPoison) or None. From the config: the run's `seed`, the `client` section and
        its rate under client.lr_schedule (`client_rate`, schedules.LearningRate), the `data` section
        (data.augment), the `server` section (clients_per_round, weighting), runtime.client_dealing and
        eval.batch_size (`eval_batch`, SAFL's probes)."""
        self.comm, self.workers, self.algo, self.flat = comm, workers, algo, flat
        self.seed, self.client, self.client_rate, self.eval_batch = seed, client, client_rate, eval_batch
        self.clients_per_round, self.weighting = server.clients_per_round, server.weighting
        self.poison = poison
        self.parts = parts
        self.sizes = np.array([len(p) for p in parts])
        self.host = place_clients(self.sizes, workers)
        self.mine = set(np.flatnonzero(self.host == comm.rank).tolist())
        self.balanced = (len(workers) > 1 and algo.protocol == REDUCE and not algo.keeps_client_state
                         and not keeps_state)
        self.trains = bool(self.mine) or (self.balanced and comm.rank in workers)
        self.x_train = self.y_train = self.trainer = self.group_trainer = None
        if self.trains:
            self.x_train, self.y_train = device_data.train
            self.client_idx = ClientIndex(parts, flat.device)
            self.trainer = LocalTrainer(flat, client, self.x_train, self.y_train,
                                        transform=make_transform(data, device_data.dataset.input_shape), loss=loss)
        self.batched = batched = self._plan_vectorize(loss)
        # runtime.client_dealing auto: dealt clients go to the workers as they become free (fedmpi.mpi.tickets),
        # where they train one by one; a batched group needs its clients known before it trains. The same
        # decision on every rank (the counter is made collectively); None: fixed shares (place_clients).
        self.tickets = (comm.ticket_counter()
                        if self.balanced and client_dealing == "auto" and not batched else None)

    def _plan_vectorize(self, loss):
        """`client.vectorize`: off, or auto/on when the algorithm and the model allow batched groups (`on` where
        they cannot was refused by fedmpi.run.resolve). Whether clients train in batched groups (the same on
        every rank and at every -n)."""
        mode = self.client.vectorize
        if mode == "off":
            return False
        blocker = vectorized.unsupported(self.flat)
        if not self.algo.vectorizable:
            blocker = f"algorithm.name = {self.algo.name!r} does not declare its clients vectorizable"
        elif self.algo.split is not None:
            blocker = "clients with personal parameters (model.personal) start from their own entries"
        elif loss is not None:
            blocker = "a custom loss trains client by client"
        if blocker:
            return False
        # auto: one decision for the whole job from the config (the model, the partition's sizes, the round's
        # size), never from how many clients a rank holds, which follows -n (fedmpi.core.vectorized)
        if mode == "auto" and not (vectorized.worthwhile(self.flat) and vectorized.alike_enough(
                self.sizes, self.client, self.clients_per_round)):
            return False
        if self.trains:
            self.group_trainer = vectorized.GroupTrainer(self.flat, self.client, self.x_train, self.y_train,
                                                         transform=self.trainer.transform)
        return True

    # -- which clients train here --------------------------------------------------------------------
    def round_clients(self, selected, as_free=False):
        """This rank's clients among the round's `selected`: its hosted ones in increasing id, or with `balanced`
        its share of a deal of the selected clients: with `as_free` and a ticket counter, the ones it takes
        as it becomes free (DealtClients; the protocol needs only each rank's sums), else the fixed share of
        a largest-first deal (the same on every rank), in increasing id."""
        if not self.balanced:
            return [int(c) for c in selected if int(c) in self.mine]
        if as_free and self.tickets is not None:
            return DealtClients(deal_order(selected, self.sizes), self.tickets)
        share = place_clients([len(self.parts[c]) for c in selected], self.workers)
        return [int(c) for c, rank in zip(selected, share) if rank == self.comm.rank]

    def open_deal(self):
        """Every rank, before the round's broadcast: rank 0 sets the tickets back to the first."""
        if self.tickets is not None and self.comm.rank == 0:
            self.tickets.reset()

    def hosted(self, clients):
        """The clients of `clients` this rank hosts, in the given order."""
        return [int(c) for c in clients if int(c) in self.mine]

    # -- training -------------------------------------------------------------------------------------
    def new_run(self, t, cid):
        # server.weighting uniform: every client counts 1 in the average (None: its sample count)
        weight = 1.0 if self.weighting == "uniform" else None
        return ClientRun(cid, t, len(self.parts[cid]), lr=self.client_rate.at(t), weight=weight)

    def schedule_of(self, run, standard):
        custom = self.algo.schedule(run.cid, self.algo.sizes, standard)
        return Schedule(*custom) if custom else schedule(self.client, run.n_samples)

    def train_one(self, t, cid, standard, load_start, down=None):
        """Trains client `cid` from the start point that `load_start(run)` puts into the model (the algorithm's
        `local_training` hook runs its passes instead of the one pass, where it has one). The result is in
        `self.flat.vec`; returns its ClientRun."""
        seed, algo = self.seed, self.algo
        run = self.new_run(t, cid)
        sched = self.schedule_of(run, standard)
        load_start(run)
        if algo.local_training is not None:
            loss_sum, seen = algo.local_training(run, down, self.flat, LocalPasses(self, run, sched))
        else:
            seed_torch_on(self.flat.device, seed, rng.CLIENT, t, cid, 1)
            loss_sum, seen = self.trainer.train(self.client_idx[cid], rng.stream(seed, rng.CLIENT, t, cid),
                                                sched, lr=run.lr, grad_hook=algo.grad_hook, loss_fn=algo.loss_fn,
                                                step_hook=algo.step_hook, poison=self._poison(t, cid))
        run.steps, run.loss_sum, run.seen = sched.steps, loss_sum, seen
        run.figures["loss"] = float(loss_sum) / max(seen, 1)
        return run

    def train(self, t, cids, standard, down, load_start):
        """Trains the clients `cids` of round t, batched groups first (`client.vectorize`), then the rest one by
        one; yields each client's ClientRun with its result in `self.flat.vec`."""
        groups, rest = self._vector_groups(t, cids, standard)
        for runs, sched in groups:
            yield from self._train_group(runs, sched, down)
        slow = _slow_clients_delay(self.comm.rank)
        for cid in rest:
            if slow:
                time.sleep(slow)
            yield self.train_one(t, cid, standard, load_start, down)

    def _vector_groups(self, t, cids, standard):
        """([(runs, schedule)] trained as batched groups, [client ids] for the per-client loop): with a group
        trainer every client trains batched, in groups of its batch pattern of whatever size this rank has."""
        if self.group_trainer is None:
            return [], cids             # as they come (DealtClients takes a ticket per client)
        by_key = {}
        for cid in cids:
            run = self.new_run(t, cid)
            sched = self.schedule_of(run, standard)
            by_key.setdefault(vectorized.group_key(run.n_samples, sched), (sched, []))[1].append(run)
        groups = []
        for sched, runs in by_key.values():
            groups.extend((chunk, sched) for chunk in vectorized.chunks(runs, self.group_trainer.max_group))
        return groups, []

    def _train_group(self, runs, sched, down):
        """One batched group from the broadcast vector (`vectorizable`: the start point is the broadcast)."""
        seed = self.seed
        clients = [(self.parts[run.cid], rng.stream(seed, rng.CLIENT, run.round, run.cid)) for run in runs]
        poisons = [self._poison(run.round, run.cid) for run in runs]
        weights, loss_sums, seen = self.group_trainer.train(down, clients, sched, lr=runs[0].lr,
                                                            poisons=poisons if any(poisons) else None)
        losses = loss_sums.tolist()
        for i, run in enumerate(runs):
            run.steps, run.loss_sum, run.seen = sched.steps, loss_sums[i], seen
            run.figures["loss"] = losses[i] / max(seen, 1)
            self.flat.vec.copy_(weights[i])
            yield run

    def _poison(self, t, cid):
        """The batch function of a malicious client under a data attack; None for every other client."""
        return self.poison.for_client(t, cid) if self.poison is not None else None

    def probe_accuracy(self, vec, indices):
        """Accuracy of model `vec` on training samples `indices` (SAFL's probe sets); loads `vec`."""
        self.flat.load(vec)
        idx = torch.from_numpy(np.asarray(indices)).to(self.flat.device)
        acc, _ = evaluate(self.flat.module, self.x_train[idx], self.y_train[idx], self.eval_batch)
        return acc
