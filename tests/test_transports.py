"""Each transport alone (fedmpi.round.protocols): built from its collaborators, fed hand-made ClientUpdates,
combined over LocalComm, with no config and no Experiment. Every figure is worked out here from the updates:
REDUCE's weighted float64 sums, consumed as a stream; secure aggregation's decoded integer sum with no float
model vector reduced; GATHER's fusion in client-id order; BUFFER's releases; ROUTE's statistics-only rounds
inside a period; the chunked gather's coordinate-wise median."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transport_support as ts
from conftest import VecModel

from fedmpi.core import rng
from fedmpi.deploy.buffered import BufferedPlan
from fedmpi.mpi.local import LocalComm
from fedmpi.robust.catalog import build_rule
from fedmpi.robust.keys import RobustConfig
from fedmpi.round.observers import ClientDrift
from fedmpi.round.protocols import Buffer, Gather, Reduce, RoundInput, SecureReduce, Training
from fedmpi.round.robust_gather import ChunkedGather, GatherSettings
from fedmpi.round.route import Route
from fedmpi.secagg import agreement, masks
from fedmpi.secagg.checks import Plan
from fedmpi.secagg.keys import SecAggConfig
from fedmpi.secagg.stage import SecAggStage

DIM = 3
DOWN = torch.tensor([1.0, -1.0, 0.5])
CLIENTS = [(0, 2, 1, [1.5, -1.0, 0.0]), (1, 3, 1, [0.0, 2.0, 0.5]), (2, 5, 1, [1.0, -3.0, 4.0])]
SIZES = [2, 3, 5]


class Mean:
    """FedAvg's upload rule written out: the weighted update w_i (y_i - x) into the sums."""

    dim, up_vectors, up_scalars, down_vectors, wire_dim, client_columns = DIM, 1, 0, 1, DIM, ()
    protocol = "reduce"

    def accumulate(self, run, down, model, acc):
        acc[: self.dim].add_(model.vec - down[: self.dim], alpha=run.weight)
        return run.weight

    def keep_personal(self, cid, flat, down):
        pass


def _reduce(algo, counted=None, comm=None, transport_cls=Reduce, stages=(), **extra):
    model = VecModel(DIM)
    wire = ts.buffers(algo, len(SIZES), comm, up_extra=sum(s.up_scalars for s in stages))
    p = ts.path(stages, algo)
    transport = transport_cls(algo, ts.host(model, SIZES), wire, p, ClientDrift(len(SIZES), False), **extra)
    round_ = ts.round_input(4, [0, 1, 2], DOWN, counted, p=p)
    wire.start_round(round_.plan.selected)
    return transport, wire, model, round_


def test_reduce_sums_the_counted_updates_weighted_in_float64_as_a_stream():
    transport, wire, model, round_ = _reduce(Mean(), counted=[True, False, True])
    seen = []

    def stream():
        for update in ts.trained(model, DOWN, 4, CLIENTS):
            seen.append(float(wire.acc[:DIM].abs().sum()))      # what was summed before this client arrived
            yield update

    combined = transport.combine(LocalComm(), round_, transport.local(round_, stream()))
    expected = sum(n * (torch.tensor(y, dtype=torch.float64) - DOWN.double())
                   for cid, n, _, y in CLIENTS if cid != 1)
    assert torch.equal(combined.sums[:DIM], expected) and combined.weight == 7.0
    assert combined.stats.uploads == 2 and combined.stats.bytes_up == 2 * 4 * DIM      # dense float32 uploads
    # Each client was summed before the next one was asked for (no vector kept per client): the sums grew
    # after client 0 and stood still over the uncounted client 1.
    assert seen[0] == 0 and seen[1] > 0 and seen[2] == seen[1]


def test_reduce_gives_the_same_bits_whatever_order_the_clients_arrive_in():
    first, wire, model, round_ = _reduce(Mean())
    a = first.combine(LocalComm(), round_, first.local(round_, ts.trained(model, DOWN, 4, CLIENTS))).sums.clone()
    second, wire, model, round_ = _reduce(Mean())
    b = second.combine(LocalComm(), round_, second.local(round_, ts.trained(model, DOWN, 4, CLIENTS[::-1]))).sums
    assert torch.allclose(a, b, rtol=0, atol=1e-15)


class Recording(LocalComm):
    def __init__(self):
        super().__init__()
        self.reduced = []

    def reduce_sum(self, buf):
        self.reduced.append((buf.dtype, buf.size))
        return super().reduce_sum(buf)

    def reduce_sum_mod(self, buf, bits):
        self.reduced.append((buf.dtype, buf.size))
        return super().reduce_sum_mod(buf, bits)


def test_secure_reduce_decodes_the_integer_sum_and_reduces_no_float_model_vector():
    keys = SecAggConfig(bits=24, clip=10.0, scale=1000.0)
    stage = SecAggStage(keys, Plan("secagg", 3, 2, 2, 20, 0), seed=5, dim=DIM)
    comm = Recording()
    transport, wire, model, round_ = _reduce(Mean(), comm=comm, transport_cls=SecureReduce, stages=(stage,),
                                             secure=stage)
    combined = transport.combine(comm, round_, transport.local(round_, ts.trained(model, DOWN, 4, CLIENTS)))
    expected = np.zeros(DIM, dtype=np.int64)
    for cid, _, _, y in CLIENTS:
        delta = (torch.tensor(y) - DOWN).double().numpy()
        expected += masks.quantize(delta, 10.0, 1000.0, rng.stream(5, rng.SECAGG, 4, cid, agreement.ROUNDING))[0]
    assert torch.equal(combined.sums[:DIM], torch.from_numpy(expected / 1000.0))
    assert combined.weight == 3.0 and combined.metrics["secagg_failed"] == 0       # uniform weights, 1 each
    # One integer reduction of the masked vector, one float reduction without the model's DIM sums.
    (int_dtype, int_size), (float_dtype, float_size) = comm.reduced
    assert (int_dtype, int_size) == (np.uint64, DIM) and float_dtype == np.float64
    assert float_size == wire.up_end - DIM


class Gating:
    """SAFL's contract by hand: even clients upload; the server weighs an upload by its client's samples."""

    dim, up_vectors, up_scalars, down_vectors, wire_dim, client_columns = DIM, 1, 0, 1, DIM, ("gap",)

    def gate(self, run, down, model):
        return run.cid % 2 == 0

    def fusion_weight(self, n_samples, z, x):
        return float(n_samples)


def test_gather_fuses_the_uploaders_vectors_in_client_id_order_and_skips_the_uncounted():
    model, settled = VecModel(DIM), []
    wire = ts.buffers(Gating(), len(SIZES))
    participation = SimpleNamespace(settle=lambda plan, comm, gathered: settled.append(sorted(gathered)))
    x = torch.tensor([0.5, 0.5, 0.5])
    transport = Gather(Gating(), ts.host(model, SIZES), wire, ts.path(), participation, SimpleNamespace(x=x))
    round_ = ts.round_input(0, [0, 1, 2], DOWN, counted=[True, True, True])
    wire.start_round(round_.plan.selected)
    combined = transport.combine(LocalComm(), round_, transport.local(round_, ts.trained(model, DOWN, 0, CLIENTS)))
    expected = 2 * (torch.tensor(CLIENTS[0][3]).double() - 0.5) + 5 * (torch.tensor(CLIENTS[2][3]).double() - 0.5)
    assert torch.equal(combined.sums[:DIM], expected) and combined.weight == 7.0
    assert settled == [[0, 2]] and combined.stats.uploads == 2


class Holding:
    """FedBuff's contract by hand: a counted client's update held, released (weight 1) when it arrives."""

    dim, up_vectors, up_scalars, down_vectors, wire_dim, client_columns = DIM, 1, 0, 1, DIM, ()

    def __init__(self):
        self.pending = {}

    def hold(self, run, down, model):
        self.pending[run.cid, run.round] = (model.vec - down[: self.dim]).double()

    def release(self, cid, version, round_, acc):
        acc[: self.dim] += self.pending.pop((cid, version))
        return 1.0


def test_buffer_holds_the_round_s_updates_and_releases_only_the_arrivals():
    algo, model = Holding(), VecModel(DIM)
    algo.pending[1, 2] = torch.tensor([7.0, 0.0, 0.0], dtype=torch.float64)       # trained in round 2
    wire = ts.buffers(algo, len(SIZES))
    transport = Buffer(algo, ts.host(model, SIZES), wire, ts.path())
    plan = BufferedPlan(3, np.array([0, 2]), np.array([0, 2]), np.array([True, False]), arrivals=[(1, 2), (0, 3)])
    round_ = RoundInput(plan, Training([0, 2], None, DOWN))
    wire.start_round(plan.selected)
    local = transport.local(round_, ts.trained(model, DOWN, 3, [CLIENTS[0], CLIENTS[2]]))
    combined = transport.combine(LocalComm(), round_, local)
    # Client 2 does not count (dropped): never held. Client 1's round-2 update and client 0's fresh one arrive.
    assert list(algo.pending) == []
    expected = torch.tensor([7.0, 0.0, 0.0], dtype=torch.float64) + (torch.tensor(CLIENTS[0][3]) - DOWN).double()
    assert torch.equal(combined.sums[:DIM], expected) and combined.weight == 2.0 and combined.stats.uploads == 2


class Slots:
    """FedSkip's contract by hand: two-round periods, slots in plan order, weights the slots' samples."""

    dim, up_vectors, up_scalars, down_vectors, wire_dim, client_columns = DIM, 1, 0, 1, DIM, ()

    def __init__(self):
        self.slots, self.accumulated = {}, []

    def is_period_start(self, t):
        return t % 2 == 0

    def is_aggregation(self, t):
        return t % 2 == 1

    def order(self, t, selected):
        return list(selected)

    def finish_slot(self, run, slot, flat):
        self.slots[slot] = flat.vec.clone()

    def slot_weights(self, t, weight_of):
        return [weight_of(t, c) for c in (0, 1)]

    def accumulate_slots(self, start, weights, acc):
        self.accumulated.append(list(weights))
        for slot, w in zip(sorted(self.slots), weights):
            acc[: self.dim].add_(self.slots[slot].double() - start.double(), alpha=w)
        self.slots.clear()
        return float(sum(weights))


@pytest.mark.parametrize("t, aggregates", [(0, False), (1, True)])
def test_route_reduces_statistics_only_inside_a_period_and_the_slots_at_its_end(t, aggregates):
    algo, model = Slots(), VecModel(DIM)
    wire = ts.buffers(algo, len(SIZES))
    participation = SimpleNamespace(counted=lambda s, c: True)
    transport = Route(algo, ts.host(model, SIZES), wire, ts.path(), participation, LocalComm())
    transport.period_start, transport.previous = DOWN.clone(), object()
    plan = ts.round_input(t, [0, 1], DOWN).plan
    round_ = RoundInput(plan, Training([0, 1], None, None, slots={0: 0, 1: 1}))      # client 0 trains slot 0...
    wire.start_round(plan.selected)
    local = transport.local(round_, ts.trained(model, DOWN, t, CLIENTS[:2]))
    combined = transport.combine(LocalComm(), round_, local)
    assert combined.update is aggregates and combined.evaluate is aggregates and transport.previous is round_.plan
    assert combined.stats.uploads == 2
    if aggregates:
        expected = sum(n * (torch.tensor(y).double() - DOWN.double()) for _, n, _, y in CLIENTS[:2])
        assert algo.accumulated == [[2, 3]] and torch.equal(combined.sums[:DIM], expected)
        assert combined.weight == 5.0
    else:
        assert algo.accumulated == [] and combined.weight == 0.0


def test_the_chunked_gather_combines_the_counted_rows_by_its_rule_chunk_by_chunk():
    model = VecModel(DIM)
    wire = ts.buffers(Mean(), len(SIZES))
    settings = GatherSettings(rule=build_rule("median", RobustConfig()), budget=1, malicious=np.array([], int),
                              block=1)
    transport = ChunkedGather(Mean(), ts.host(model, SIZES), wire, ts.path(), settings)
    round_ = ts.round_input(0, [0, 1, 2], DOWN)
    wire.start_round(round_.plan.selected)
    combined = transport.combine(LocalComm(), round_, transport.local(round_, ts.trained(model, DOWN, 0, CLIENTS)))
    rows = np.stack([np.asarray(y, dtype=np.float32) - DOWN.numpy() for _, _, _, y in CLIENTS])
    assert np.allclose(combined.sums[:DIM].numpy(), np.median(rows, axis=0), rtol=0, atol=1e-7)
    assert combined.weight == 1.0 and combined.stats.uploads == 3 and combined.stats.weight == 10.0
    assert not math.isnan(combined.columns["robust_weight"][0])
