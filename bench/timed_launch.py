"""One timed `mpiexec -n P COMMAND` for the benchmarks that compare ways of launching (bench/sweep.py,
bench/counterfactual_launch.py): its output appended to a log file, its wall time returned, a failure the
benchmark's end (a timing of a failed launch would compare nothing)."""

from __future__ import annotations

import os
import subprocess
import time


def timed_launch(script, np, command, log, cwd):
    """Seconds `mpiexec -n np COMMAND...` took, run in `cwd` with its output appended to `log`; SystemExit naming
    `script` and the log where it fails. mpiexec: $MPIEXEC, else the one beside the running Python, else PATH's."""
    from fedmpi.analysis.batch_report import require_mpiexec

    mpiexec = os.environ.get("MPIEXEC") or require_mpiexec(script, "or set MPIEXEC")
    cmd = [mpiexec, "-n", str(np), *command]
    began = time.monotonic()
    with open(log, "a") as fh:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd).returncode
    if code:
        raise SystemExit(f"{script}: {' '.join(cmd)} exited {code}; see {log}")
    return time.monotonic() - began
