"""Set-up on every rank, in three steps (docs/explanation/design.md §5): measure what the config runs on (this node, the
data set, the partition, the initial model), resolve the config against those shapes into a checked RunPlan
(fedmpi.run.resolve, the only validation of how components combine), then build the Experiment from the plan
(fedmpi.round.experiment, straight-line assembly without checks).

No random choice is communicated: every rank derives the partition and the initial model from the seed. The
only collectives are the node's (`node_local`, the data set's sharing), before anything can fail on one rank
alone; nothing is written, so a refusal ends every rank the same way before any file is touched.
"""

from __future__ import annotations

import dataclasses
import time

from fedmpi.core import console, cpu_kernels, rng, shared_base
from fedmpi.core.flat import FlatModel, forward_probe
from fedmpi.core.models import build_model
from fedmpi.data.announce import loaded_line, loading_line
from fedmpi.data.data_shape import DataShape
from fedmpi.data.shared import load_shared
from fedmpi.mpi import signals
from fedmpi.mpi.runtime import pick_device, set_deterministic, set_threads
from fedmpi.round.experiment import Experiment, build_partition
from fedmpi.run.resolve import resolve


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where this rank computes: its node, the ranks that train clients, its threads and its device."""

    node: object
    workers: tuple
    threads: int
    device: object


def experiment(cfg, comm, *, dataset=None, model=None, parts=None, loss=None) -> Experiment:
    """This rank's Experiment of `cfg`. `dataset` (a fedmpi.data.Dataset), `model` (an nn.Module), `parts`
    (the clients' index arrays) and `loss` (a criterion on outputs and targets) replace what the config would
    build: the in-process API (`fedmpi.simulate`) passes them for custom experiments."""
    import torch

    gpus = torch.cuda.device_count() if cfg.runtime.device != "cpu" else 0
    node = comm.node_local(gpus)      # with the data's sharing, the only collectives of set-up
    # The node's ranks share one copy of the data set (collective over the node, before anything here can
    # fail on one rank alone).
    dataset = dataset if dataset is not None else _load_data(cfg, comm)
    placement = _placement(cfg, comm, node)
    signals.test_pause("partition")
    split = build_partition(cfg, dataset, parts)
    zoo_model = model is None       # `kernels: auto` trusts only the zoo's own declared models
    if model is None:
        rng.seed_torch(cfg.seed, rng.INIT)     # every rank builds the same initial model, on the CPU
        model = build_model(cfg.model, dataset.input_shape, dataset.num_classes, cfg.lora)
    # Judged by resolve: does the config's model take the data? (A model handed in with its own loss is the
    # caller's pairing: its outputs need not be class scores.)
    probe = forward_probe(model, dataset.x_train) if zoo_model else None
    signals.test_pause("model")

    # -- the frozen base once per node (fedmpi.core.shared_base): after the algorithm prepared the model (it
    # may freeze more, e.g. FFA-LoRA's A), before FlatModel lays the trainable rest onto the flat vector.
    _share_frozen_base(model, comm, gpus)
    # --
    flat = FlatModel(model, placement.device)
    if cpu_kernels.wanted(cfg.runtime.kernels, cfg.model.name if zoo_model else None, placement.device):
        cpu_kernels.use_fast_kernels(flat)
    plan = resolve(cfg, DataShape.of(dataset), flat.describe(probe), custom_loss=loss is not None)
    return Experiment(plan, comm, placement, dataset, split, flat, loss=loss)


def _share_frozen_base(model, comm, gpus):
    """The model's frozen parameters into the node's shared window (collective over the node; on CPU nodes
    only: a GPU takes its own copy anyway), and rank 0 keeps their hash for run.h5."""
    if gpus == 0:
        shared_base.share_base(model, comm)
    if comm.rank == 0:
        setattr(model, shared_base.MODULE_ATTR, shared_base.base_sha256(model))


def _load_data(cfg, comm):
    """The node-shared data set, announced on rank 0 as it starts and ends (unless progress is off)."""
    say = comm.rank == 0 and cfg.runtime.progress != "off"
    if say:
        console.say(loading_line(cfg.data))
    start = time.perf_counter()
    dataset = load_shared(cfg, comm)
    if say:
        console.say(loaded_line(dataset, cfg.partition.clients, time.perf_counter() - start))
    return dataset


def _placement(cfg, comm, node) -> Placement:
    workers = _workers(cfg.server.trains_clients, comm, node)
    computing = node.local_size - (1 if node.server_here and 0 not in workers else 0)
    threads = set_threads(cfg.runtime.threads, computing, node.cores)
    set_deterministic(cfg.runtime.deterministic)      # before the device's first kernels
    return Placement(node, workers, threads, pick_device(cfg.runtime.device, node.local_rank))


def _workers(trains, comm, node):
    """The ranks that train clients: 1..P-1, plus rank 0 with `server.trains_clients` (null: when rank 0's
    node is a CPU node with a core its other ranks leave idle, e.g. -n 2 on two cores)."""
    if comm.size == 1:
        return comm.workers
    if trains is None:
        trains = node.server_spare_core()
    return tuple(range(comm.size)) if trains else tuple(range(1, comm.size))
