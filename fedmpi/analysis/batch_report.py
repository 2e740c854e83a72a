"""The harness shared by the report scripts of tools/ (reproduce.py, deploy_report.py, privacy_report.py):
their common options, one `mpiexec -n NP tools/run_batch.py` launch of a set of configs times seeds, the
runs read back per setting, and a document's marked section replaced in place."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

from fedmpi.analysis import report
from fedmpi.core.input_files import read_input
from fedmpi.core.output_paths import replace_with
from fedmpi.core.tool_outputs import place

# The checkout (tools/ beside fedmpi/): this file is fedmpi/analysis/batch_report.py.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_BATCH = os.path.join(ROOT, "tools", "run_batch.py")


def find_mpiexec():
    """mpiexec beside this Python first (a virtual environment's mpich), then on PATH; None if there is none."""
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def require_mpiexec(script, hint=""):
    """find_mpiexec's launcher for a tool or benchmark called SCRIPT; without one, one line naming where it
    was looked for and exit 2 (a FileNotFoundError traceback otherwise, when the venv's bin is not on PATH).
    `hint`: what else the user may do, e.g. "or pass --ranks 1"."""
    found = find_mpiexec()
    if found is None:
        print(f"{script}: no mpiexec beside {sys.executable} or on PATH; install an MPI (pip install mpich)"
              f"{' ' + hint if hint else ''}", file=sys.stderr)
        raise SystemExit(2)
    return found


def add_options(p, runs, docs_help, seeds=(0, 1), rounds=None, np=3,
                rounds_help="rounds per run (default: the configs')", seeds_help=None, np_help=None):
    """The options every report script has: --rounds --seeds --np --runs --docs --threads --reuse --report-only.
    `runs`: the runs folder's default name in the working folder, e.g. runs/privacy (place_outputs)."""
    p.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    p.add_argument("--seeds", type=int, nargs="+", default=list(seeds),
                   help=seeds_help or f"seeds per setting (default {' '.join(map(str, seeds))})")
    p.add_argument("--np", type=int, default=np, help=np_help or f"MPI ranks (default {np})")
    p.set_defaults(runs_name=runs)
    p.add_argument("--runs", help=f"folder for the runs (default: ./{runs}, refused inside the checkout)")
    p.add_argument("--docs", help=f"{docs_help} (default: the working folder, refused inside the checkout; the "
                                  f"published ones: --docs docs/results)")
    p.add_argument("--threads", type=int, help="torch threads per rank (default: cores / ranks)")
    p.add_argument("--reuse", action="store_true", help="keep finished runs of the same length")
    p.add_argument("--report-only", action="store_true", help="do not run, only rebuild the report")


def place_outputs(args, script):
    """--runs and --docs as absolute paths, left-out ones in the working folder and refused inside the
    checkout (fedmpi.core.tool_outputs), decided before anything runs."""
    args.runs, args.docs = place(script, ROOT, (args.runs, args.runs_name, "--runs"),
                                 (args.docs, ".", "--docs", "docs/results"))
    return args


def command_line(script, args, default_seeds, first=()):
    """The command that regenerates a report from the checkout: `python tools/SCRIPT FIRST... --runs RUNS
    --docs docs/results` (its outputs named, as inside the checkout they must be) plus the options that differ from
    their defaults."""
    parts = ["python", f"tools/{script}", *first, "--runs", args.runs_name, "--docs", "docs/results"]
    if args.rounds is not None:
        parts += ["--rounds", str(args.rounds)]
    if args.seeds != list(default_seeds):
        parts += ["--seeds", *map(str, args.seeds)]
    if args.np != 3:
        parts += ["--np", str(args.np)]
    return shlex.join(parts)


def launch(script, args, configs, out_root, rounds=None):
    """Every config once per seed of `args.seeds` in one `mpiexec -n args.np` launch of tools/run_batch.py
    into OUT_ROOT/<config>-seed<S> (finished runs kept with --reuse); `rounds` overrides the configs' and
    `args.threads` the torch threads. Returns the launch's wall seconds; SystemExit naming SCRIPT if it fails."""
    mpiexec = require_mpiexec(script)
    overrides = ([f"rounds={rounds}"] if rounds is not None else []) + (
        [f"runtime.threads={args.threads}"] if args.threads else [])
    cmd = [mpiexec, "-n", str(args.np), sys.executable, RUN_BATCH, *configs, "--seeds", *map(str, args.seeds),
           "--out-root", out_root, "--overwrite", *(["--skip-finished"] if args.reuse else []), *overrides]
    print("+", shlex.join(cmd), flush=True)
    start = time.monotonic()
    code = subprocess.call(cmd, cwd=ROOT)
    if code:
        raise SystemExit(f"{script}: the runs failed (exit {code})")
    return time.monotonic() - start


def load_runs(script, out_root, names, seeds):
    """{name: [the run of each seed]} from OUT_ROOT/<name>-seed<S>/run.h5; a missing run is an error naming it."""
    groups = {}
    for name in names:
        paths = [os.path.join(out_root, f"{name}-seed{s}", "run.h5") for s in seeds]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise SystemExit(f"{script}: missing runs: {', '.join(missing)} (run without --report-only)")
        groups[name] = [report.read_run(p) for p in paths]
    return groups


def replace_section(path, begin, end, text, heading):
    """Replaces the text from marker `begin` to marker `end` in the document at `path` by `text` (which
    carries the markers); the first time, appends `heading` and `text` to it (or starts the document)."""
    doc = read_input(path, f"the document {path}").decode("utf-8") if os.path.exists(path) else ""
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + text + rest.split(end, 1)[1]
    else:
        doc = doc.rstrip("\n") + f"\n\n{heading}\n\n" + text + "\n"
    replace_with(path, lambda fh: fh.write(doc))     # atomic: a full disk never leaves the document cut short
