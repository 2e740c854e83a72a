"""The sweep's data sets, each loaded once per node before the first experiment starts and shared read-only by
every experiment that reads it, on every rank of the node (fedmpi.data.shared.load_shared over the whole
launch: one MPI-3 shared-memory window per data set and node). Experiments read the same data set when their
`configs.data_key` is equal: the data section, plus the seed and clients of `synthetic`. They are held until the
sweep ends (a grid over many data sets holds them all); in a sweep a data set is node-shared whatever
`runtime.shared_data` says, which changes no result.

A data set that fails to load (a missing file on one node) refuses the sweep before anything starts: every
rank votes, the lowest rank with the worst exit code prints what it saw, every rank exits with that code.
"""

from __future__ import annotations

import dataclasses

from fedmpi.core import console
from fedmpi.core.errors import EXIT_FAILED, FedmpiError, Refused, report_lines
from fedmpi.data.shared import load_shared
from fedmpi.sweep.configs import data_key


def load_all(configs, comm) -> dict:
    """{data key: Dataset} of every data set the configs read, in the spec's order (collective over `comm`, the
    launch's communicator); Refused (its reason printed once) on every rank when one failed anywhere."""
    datasets, errors = {}, []
    for cfg in configs:
        key = data_key(cfg)
        if key in datasets:
            continue
        try:
            datasets[key] = load_shared(_shared(cfg), comm)
        except Exception as e:  # noqa: BLE001 - every rank must reach the vote whatever went wrong
            datasets[key] = None
            errors.append(e)
    code = max((e.exit_code if isinstance(e, FedmpiError) else EXIT_FAILED for e in errors), default=0)
    worst, speaker = comm.agree(code)
    if worst:
        if comm.rank == speaker:
            for e in errors:
                for line in report_lines(e, comm.rank if comm.size > 1 else None):
                    console.say(line)
        comm.close()
        raise Refused(worst)
    return datasets


def _shared(cfg):
    """`cfg` with its data set node-shared (see the module docstring)."""
    if cfg.runtime.shared_data:
        return cfg
    return dataclasses.replace(cfg, runtime=dataclasses.replace(cfg.runtime, shared_data=True))


def megabytes(datasets) -> float:
    """What the data sets hold, in MB (per node)."""
    total = 0
    for ds in datasets.values():
        for name in ("x_train", "y_train", "x_test", "y_test"):
            total += getattr(getattr(ds, name, None), "nbytes", 0)
    return total / 1e6
