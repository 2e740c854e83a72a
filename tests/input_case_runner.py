"""Runs `fedmpi ARGV` cases for tests/test_input_files.py, each in a process of its own with a time and an
address-space bound, without paying Python's and torch's imports once per case: this script imports fedmpi
once, then forks one child per case (the child sets RLIMIT_AS, sends its output to files and calls
fedmpi.cli.main). A child past its time is killed (SIGKILL), so an input read forever is a failed case, never
a hung suite.

    python tests/input_case_runner.py CASES.json RESULTS.json SECONDS BUDGET

CASES.json: [{"id": ..., "cwd": ..., "argv": [...]}]; RESULTS.json gets {id: {"code", "err", "hung",
"seconds"}}, written after every case (a runner killed from outside leaves the cases it finished). No case
starts after BUDGET seconds: a regression that makes every case hang is reported within the budget."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time

# The fuzz suite's bound on what a case may add to the address space (an unbounded read stops there); this
# script runs from tests/, so its sibling module imports as the fuzz tests import it.
from fuzz_harness import EXTRA_ADDRESS_SPACE, _address_space


def _child(case, err_path, out_path):
    from fedmpi.cli import main

    os.chdir(case["cwd"])
    size = _address_space()
    if size is not None:
        resource.setrlimit(resource.RLIMIT_AS, (size + EXTRA_ADDRESS_SPACE, resource.RLIM_INFINITY))
    for fd, path in ((1, out_path), (2, err_path)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    sys.stdout = open(1, "w", closefd=False)     # noqa: SIM115 - the child ends with os._exit
    sys.stderr = open(2, "w", closefd=False)     # noqa: SIM115
    code = 70
    try:
        code = main(case["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:       # noqa: BLE001 - what escaped main is the finding: its traceback, exit 70
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def run_case(case, seconds, scratch):
    err_path, out_path = os.path.join(scratch, "err"), os.path.join(scratch, "out")
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child(case, err_path, out_path)
        finally:
            os._exit(71)
    hung, status = False, None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - started > seconds:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            hung = True
            break
        time.sleep(0.02)
    code = None if hung else (os.waitstatus_to_exitcode(status))
    err = ""
    if os.path.exists(err_path):
        with open(err_path, encoding="utf-8", errors="replace") as fh:
            err = fh.read()[-4000:]
    return {"code": code, "err": err, "hung": hung, "seconds": round(time.monotonic() - started, 2)}


def main(cases_path, results_path, seconds, budget):
    import h5py  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import fedmpi.cli  # noqa: F401 - imported once, before the forks

    with open(cases_path) as fh:
        cases = json.load(fh)
    scratch = os.path.dirname(os.path.abspath(results_path))
    results, started = {}, time.monotonic()
    for case in cases:
        if time.monotonic() - started > budget:
            break
        results[case["id"]] = run_case(case, seconds, scratch)
        with open(results_path + ".tmp", "w") as fh:
            json.dump(results, fh)
        os.replace(results_path + ".tmp", results_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
