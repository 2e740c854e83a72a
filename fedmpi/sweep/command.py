"""`fedmpi sweep SPEC.yaml [--retry-failed] [--dry-run]`, on every rank of the launch (docs/how-to/sweeps.md).

1. Every rank reads the spec and builds every experiment's config (fedmpi.sweep.spec, .configs): a problem
   anywhere refuses the sweep with every problem at once, exit 2, before MPI starts (as `fedmpi run`).
2. MPI starts; rank 0 locks the sweep's folder (one sweep at a time on it; fedmpi.io.outdir).
3. Every data set the experiments read is loaded once per node (fedmpi.sweep.data).
4. Rank 0 resolves every config against its data set's and model's shapes, checks that the launch has the
   ranks each experiment needs and what each experiment's folder holds (fedmpi.sweep.state); any problem
   refuses the sweep, all at once, exit 2, before the first experiment starts.
5. Rank 0 dispatches, the other ranks run experiments in groups (fedmpi.sweep.dispatch, .group); one process
   alone (no mpiexec, or -n 1) runs them one after another, each at -n 1. (--dry-run: rank 0 lists them in
   the order they would start instead, and nothing is claimed or written.)
Exit: 0 when every experiment finished, 1 when the sweep ended with some failed (the index says which), 75
when it stopped on SIGTERM/SIGUSR1 (start the same spec again to continue), 130 on Ctrl-C, 2 refused.
"""

from __future__ import annotations

import dataclasses
import shlex

from fedmpi.core import console
from fedmpi.core.errors import EXIT_FAILED, EXIT_USAGE, ConfigError, FedmpiError
from fedmpi.mpi import signals
from fedmpi.sweep import configs as configs_mod
from fedmpi.sweep import index
from fedmpi.sweep import spec as spec_mod
from fedmpi.sweep.dispatch import Dispatcher, Worker, say
from fedmpi.sweep.schedule import Schedule


@dataclasses.dataclass
class Plan:
    """Rank 0's checked plan: per experiment its ranks, size, index row as found, and start mode."""

    ranks: list
    sizes: list
    rows: list
    modes: list


def sweep_command(spec_path, retry_failed=False, dry_run=False) -> int:
    spec = spec_mod.load(spec_path)
    configs = configs_mod.build(spec)
    signals.install()
    # (docs/how-to/sweeps.md: the same spec started again continues every unfinished experiment from its checkpoint)
    how = (f"continue by starting the same sweep again ({shlex.join(['fedmpi', 'sweep', str(spec_path)])}, under "
           f"mpiexec as before): its unfinished experiments go on from their checkpoints")
    with signals.keep_handlers(continue_with=how):
        code = _sweep(spec, configs, retry_failed, dry_run)
    signals.ignore_all()        # the launch's work is done (as at the end of `fedmpi run`)
    return code


def _sweep(spec, configs, retry_failed, dry_run):
    from fedmpi.io.outdir import claim_here
    from fedmpi.io.rank0 import decide
    from fedmpi.mpi.comm import make_comm
    from fedmpi.mpi.group_comm import HostShare
    from fedmpi.mpi.runtime import usable_cores
    from fedmpi.sweep import data

    comm = make_comm()
    if comm.size > 1:
        node = comm.node_local()
        host = HostShare(node.cores, node.local_size - int(node.server_here), node.local_rank)
    else:
        node, host = None, HostShare(usable_cores(), 1, 0)
    held = None if dry_run else decide(comm, lambda: (claim_here(spec.out), 0))[0]
    try:
        datasets = data.load_all(configs, comm)
        plan, _ = decide(comm, lambda: (_check(spec, configs, datasets, comm.size - 1, retry_failed,
                                               write=not dry_run), 0))
    except FedmpiError as e:
        if held is not None and e.exit_code == EXIT_USAGE:
            held.undo_if_untouched()        # a refused sweep leaves no folder or lock file of its own behind
        if held is not None:
            held.release()
        raise
    if dry_run:
        if comm.rank == 0:
            _dry_run(spec, configs, plan, datasets, comm.size)
        code = 0
    elif comm.size == 1:
        code = _serial(spec, configs, datasets, plan, host)
    else:
        code = _parallel(spec, configs, datasets, plan, host, comm, node)
    comm.close()
    if held is not None:
        held.release()
    return code


def _check(spec, configs, datasets, workers, retry_failed, write=True) -> Plan:
    """Rank 0, step 4 of the module docstring: every problem at once (ConfigError), else the Plan (and the index
    written as found, with `write`). `workers`: the ranks that run experiments (0: one process runs them all,
    each at -n 1)."""
    from fedmpi.sweep import state

    problems = configs_mod.too_many_ranks(spec, configs, workers) if workers else []
    try:
        sizes = configs_mod.check(spec, configs, datasets)
    except ConfigError as e:
        problems += e.messages
        sizes = [0] * len(configs)
    index_problem = index.place_problem(spec.out)     # before it is read: a FIFO there would block the read
    if index_problem:
        problems.append(index_problem)
    old = {} if index_problem else index.read(spec.out)
    parent, fork_problem = _fork_parent(spec.fork_from)
    problems += fork_problem
    rows, modes = [], []
    for exp, cfg in zip(spec.experiments, configs):
        found = state.assess(cfg, retry_failed)
        if parent and found.status == "pending" and found.mode != state.RESUME:
            problems += _fork_problems(exp, cfg, spec.fork_from, parent)
        if found.problem:
            problems.append(f"experiment {exp.name}: {found.problem}")
        row = index.new_row(exp, cfg, configs_mod.ranks(spec, cfg, workers) if workers else 1)
        before = old.get(exp.name)
        if before is not None:      # what earlier launches spent on it
            row.attempts, row.started, row.ended, row.wall_s = before.attempts, before.started, before.ended, \
                before.wall_s
            row.exit_code = before.exit_code if found.status != "pending" else ""
        row.status, row.message = found.status, found.note
        rows.append(row)
        modes.append(found.mode)
    if problems:
        raise ConfigError(problems)
    if write:
        index.write(spec.out, rows)
    return Plan([row.ranks for row in rows], sizes, rows, modes)


def _fork_parent(fork_from):
    """Rank 0: (the checkpoint every experiment forks from, read and checked once: fedmpi.io.fork.read_parent,
    or None; the problems found in it, one line each)."""
    from fedmpi.io.fork import read_parent

    if not fork_from:
        return None, []
    try:
        return read_parent(fork_from), []
    except FedmpiError as e:
        return None, [f"fork_from: {m}" for m in getattr(e, "messages", [str(e)])]


def _fork_problems(exp, cfg, fork_from, parent):
    """Rank 0: why experiment `exp` cannot fork from `parent` (the checks of `fedmpi run --fork-from`)."""
    from fedmpi.io.fork import choose

    try:
        choose(cfg, fork_from, parent)
    except FedmpiError as e:
        return [f"experiment {exp.name}: {m}" for m in getattr(e, "messages", [str(e)])]
    return []


def _announce(spec, plan, datasets, ranks_text):
    from fedmpi.sweep.data import megabytes

    todo = sum(row.status == "pending" for row in plan.rows)
    kept = len(plan.rows) - todo
    say(f"{len(plan.rows)} experiments in {spec.out} ({todo} to run, {kept} kept from earlier launches) "
        f"{ranks_text}; {len(datasets)} data set(s), {megabytes(datasets):.1f} MB per node")


def _dry_run(spec, configs, plan, datasets, size):
    """--dry-run: what the sweep would do, one line per experiment, in the order it would start them (with the
    ranks the spec gives it under mpiexec; one process runs each at -n 1)."""
    from fedmpi.sweep.schedule import Schedule

    _announce(spec, plan, datasets, f"on {size - 1} ranks" if size > 1 else "in one process, each at -n 1")
    ranks = [configs_mod.ranks(spec, cfg, size - 1 if size > 1 else 2 ** 31) for cfg in configs]
    order = Schedule(spec.out, plan.rows, ranks, plan.sizes, plan.modes, 1, say).queue
    how = {0: "new", 1: "continued from its checkpoint", 2: "begun again"}
    for i in order:
        print(f"{plan.rows[i].name}: {ranks[i]} rank(s), {how[plan.modes[i]]}", flush=True)
    for row in plan.rows:
        if row.status != "pending":
            print(f"{row.name}: kept ({row.status})", flush=True)


def _serial(spec, configs, datasets, plan, host) -> int:
    """One process: the experiments one after another, each at -n 1 (as `fedmpi run` without mpiexec)."""
    from fedmpi.core.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED
    from fedmpi.mpi.group_comm import GroupLocal

    _announce(spec, plan, datasets, "in one process, each at -n 1")
    schedule = Schedule(spec.out, plan.rows, plan.ranks, plan.sizes, plan.modes, 1, say)
    stopping = None
    while stopping is None and schedule.queue:
        if signals.requested():
            stopping = EXIT_PREEMPTED
            break
        i, ranks = schedule.pick({0}, {0: 0})
        schedule.start(i, ranks)
        try:
            code, status, message, wall_s = _one(spec, configs, datasets, plan.modes[i], i, GroupLocal(host))
        except KeyboardInterrupt:
            code, status, message, wall_s = EXIT_INTERRUPTED, "interrupted", "interrupted (SIGINT)", 0.0
        schedule.end(i, code, status, message, wall_s)
        if code in (EXIT_PREEMPTED, EXIT_INTERRUPTED):
            stopping = code
    schedule.write()
    code = stopping if stopping is not None else schedule.exit_code()
    say(f"ended with exit {code}; the index: {index.path_of(spec.out)}")
    return code


def _one(spec, configs, datasets, mode, i, comm):
    """Experiment `i` on `comm` (its group's), started in `mode` (fedmpi.sweep.state)."""
    from fedmpi.sweep.configs import data_key
    from fedmpi.sweep.group import run_on

    cfg = configs[i]
    dataset = dataclasses.replace(datasets[data_key(cfg)])     # its own Dataset over the shared arrays
    exp = spec.experiments[i]
    return run_on(comm, cfg, mode, dataset, exp.name, exp.run_attrs(), fork_from=spec.fork_from)


def _parallel(spec, configs, datasets, plan, host, comm, node) -> int:
    import numpy as np

    from fedmpi.sweep.group import group_comm

    mpi, world = comm.MPI, comm.comm
    nodes = np.zeros(comm.size, dtype=np.int64)
    world.Allgather(np.array([node.node], dtype=np.int64), nodes)
    control = world.Dup()
    if comm.rank == 0:
        _announce(spec, plan, datasets, f"on {comm.size - 1} ranks (rank 0 dispatches)")
        schedule = Schedule(spec.out, plan.rows, plan.ranks, plan.sizes, plan.modes, comm.size - 1, say)
        try:
            code = Dispatcher(mpi, control, schedule, {r: int(nodes[r]) for r in range(comm.size)}).run()
        except Exception as e:  # noqa: BLE001 - a fault of the sweep itself: the index as it is, the launch ends
            say(f"rank 0 failed: {type(e).__name__}: {e}")
            console.drain()
            mpi.COMM_WORLD.Abort(EXIT_FAILED)
        say(f"ended with exit {code}; the index: {index.path_of(spec.out)}")
    else:
        def run_one(i, mode, ranks):
            return _one(spec, configs, datasets, mode, i, group_comm(mpi, control, ranks, i, host))

        code = Worker(mpi, control, run_one).serve()
    control.Free()
    return code
