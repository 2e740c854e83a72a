"""What each experiment's folder holds when a sweep starts, and so what the sweep does with it: a finished run
of the same config and length is kept (skipped); a failed or diverged one is kept unless `--retry-failed`;
any other run (running when its job was killed, preempted, interrupted, finished with fewer rounds) is
continued from its newest checkpoint as `fedmpi run --resume` does, or begun again where it has none (it died
before its first checkpoint). A folder that holds a run of another config is a refusal: the sweep does not
start, naming the folder, so that no earlier result is replaced by a changed spec; so is a folder that
`fedmpi run` would refuse (fedmpi.io.outdir.check_run_folder)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fedmpi.core.errors import ConfigError
from fedmpi.io.checkpoint import list_checkpoints
from fedmpi.io.outdir import check_run_folder
from fedmpi.io.store import open_run

FRESH, RESUME, OVERWRITE = 0, 1, 2       # how the experiment's run starts: new, --resume, --overwrite
KEPT_FAILED = ("failed", "diverged")


@dataclass(frozen=True)
class Found:
    status: str          # an index status: pending (to run), finished, failed, diverged
    mode: int            # FRESH, RESUME or OVERWRITE (for pending)
    note: str = ""       # what was found, for the index's message
    problem: str = ""    # a refusal of the whole sweep (the folder holds another config's run)


def assess(cfg, retry_failed=False) -> Found:
    """Rank 0: what `cfg.out` holds (see the module docstring). A folder `fedmpi run` would refuse (a file, a
    link, run.h5 that is no regular file, ...) refuses the sweep here, before any experiment starts, and
    before anything in it is opened."""
    try:
        check_run_folder(cfg.out)
    except ConfigError as e:
        return Found("refused", FRESH, problem="; ".join(e.messages))
    path = os.path.join(cfg.out, "run.h5")
    checkpoints = list_checkpoints(cfg.out) if os.path.isdir(cfg.out) else []
    if not os.path.lexists(path):
        return Found("pending", OVERWRITE if checkpoints else FRESH)
    try:
        with open_run(path) as f:
            status, run_hash = str(f.attrs.get("status", "")), f.attrs.get("config_hash")
            rounds = int(f["metrics/round"].shape[0]) if "metrics/round" in f else 0
    except (OSError, KeyError, ValueError, TypeError) as e:
        if checkpoints:
            return Found("pending", RESUME, f"{path} unreadable ({e}); continued from its checkpoint")
        return Found("pending", OVERWRITE, f"{path} unreadable ({e}) and no checkpoint: begun again")
    if run_hash is not None and str(run_hash) != cfg.hash():
        return Found("refused", FRESH, problem=f"{cfg.out} holds a run of another config (hash {run_hash}, this "
                                               f"experiment's {cfg.hash()}); move it away or change the spec's out")
    if status == "finished" and rounds == cfg.rounds:
        return Found("finished", FRESH, "finished in an earlier launch")
    if status == "finished" and rounds > cfg.rounds:
        return Found("refused", FRESH, problem=f"{cfg.out} holds a finished run of {rounds} rounds; this experiment "
                                               f"asks for {cfg.rounds} (rounds may grow, not shrink)")
    if status in KEPT_FAILED and not retry_failed:
        return Found(status, FRESH, f"{status} in an earlier launch (kept; --retry-failed runs it again)")
    if checkpoints:
        return Found("pending", RESUME, f"continued from round {checkpoints[0][0]} (was {status or 'unknown'})")
    return Found("pending", OVERWRITE, f"begun again (was {status or 'unknown'}, no checkpoint)")
