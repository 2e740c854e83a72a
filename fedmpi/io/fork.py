"""Forkable runs: `fedmpi run CONFIG --fork-from OLD_OUT@ROUND [key=value ...]`.

A new run starts in `out` from OLD_OUT's checkpoint after ROUND rounds, with the keys it changes (the
algorithm and its keys, rounds, learning rates, schedules, ...): an ablation such as "switch FedAvg to FSL
at round 200" costs the rounds after the fork only. The new run.h5 starts with the parent's rows up to
ROUND (so curves are whole) and records the parent in root attributes `parent_out`, `parent_round`,
`parent_config_hash` and `parent_fingerprint` (SHA-256 of the model at the fork, as /metrics/model_sha256).

Every random stream is keyed by (seed, round, client), so a fork that changes nothing reproduces its
parent exactly from ROUND on (`fedmpi verify` says "identical"). What decides the data and the model
(`seed`, `data`, `partition`, `server_data`, `model`) must stay as in the parent: client states and the
global vector only make sense for the same clients and the same model. State the new algorithm does not
find in the checkpoint starts as on a fresh run (e.g. SCAFFOLD's controls at zero).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import h5py

from fedmpi.core.config_checks import show
from fedmpi.core.errors import ConfigError, InputError
from fedmpi.core.fingerprint import fingerprint
from fedmpi.core.input_files import check_input
from fedmpi.io import checkpoint, checkpoint_checks, resume
from fedmpi.io.rank0 import decide
from fedmpi.io.store import open_run

SHAPE_KEYS = ("seed", "data", "partition", "server_data", "model")
SPEC = re.compile(r"^(?P<out>.+)@(?P<round>\d+)$")


@dataclass
class ForkPoint(resume.ResumePoint):
    parent_out: str = ""
    parent_config_hash: str = ""
    parent_fingerprint: str = ""
    partial: bool = True        # the new algorithm's state not in the checkpoint starts as on a fresh run
    parent_config: dict | None = None     # the parent's stored config, as parsed YAML

    def tell_stages(self, stages):
        """Rank 0, before the run file is made: each upload stage that accounts a mechanism (`forked`) learns
        the fork's round and what the parent ran, so that its privacy figures cover exactly the rounds that
        had the mechanism (fedmpi/uploads/forked.py)."""
        for stage in stages:
            forked = getattr(stage, "forked", None)
            if forked is not None:
                forked(self.round, self.parent_config)

    def record(self, log):
        """The parent's rows up to the fork and the parent's identity, into the new run's log."""
        log.adopt_rows(os.path.join(self.parent_out, "run.h5"), self.round)
        log.set_attrs(parent_out=os.path.abspath(self.parent_out), parent_round=self.round,
                      parent_config_hash=self.parent_config_hash, parent_fingerprint=self.parent_fingerprint)


def parse(spec):
    """(parent out, round) from OLD_OUT@ROUND."""
    m = SPEC.match(spec or "")
    if not m:
        raise ConfigError(f"--fork-from {show(spec)}: expected OLD_OUT@ROUND, e.g. runs/fedavg@200")
    return m.group("out"), int(m.group("round"))


@dataclass(frozen=True)
class Parent:
    """What a fork reads of its parent, whatever the new run's config: the checkpoint after `round`, checked
    (`read_parent`); a sweep reads it once for all its experiments."""

    out: str
    round: int
    path: str
    attrs: dict
    config: dict                # the parent's stored config, as parsed YAML
    fingerprint: str            # SHA-256 of the global model at the fork


def read_parent(spec) -> Parent:
    """Rank 0: the parent's checkpoint at ROUND and its run file, checked (InputError/ConfigError, exit 2)."""
    parent, round_ = parse(spec)
    path = checkpoint.ckpt_path(parent, round_)
    if not os.path.exists(path):
        have = ", ".join(str(r) for r, _ in sorted(checkpoint.list_checkpoints(parent))) or "none"
        raise InputError(f"--fork-from {show(spec)}: no checkpoint after round {round_} in "
                         f"{checkpoint.ckpt_dir(parent)} (checkpoints there: {have})")
    check_input(path, f"--fork-from {show(spec)}: checkpoint {path}")
    try:
        attrs = checkpoint.verify(path)
    except checkpoint.DamagedCheckpoint as e:
        raise InputError(f"--fork-from: checkpoint {path} is damaged ({e})") from None
    checkpoint_checks.check_attrs(path, attrs)
    # As parsed YAML data, never built into a Config (which would import a `module:Class` it names).
    parent_cfg = checkpoint_checks.stored_config(path, attrs)
    _check_parent_log(os.path.join(parent, "run.h5"), round_)
    with h5py.File(path, "r", locking=False) as f:
        vec = f["global"][()]
    return Parent(parent, round_, path, dict(attrs), parent_cfg, fingerprint(vec))


def choose(cfg, spec, parent=None) -> ForkPoint:
    """Rank 0: the parent's checkpoint at ROUND (`parent`, where it was read already: `read_parent`), checked
    against `cfg` (InputError/ConfigError, exit 2, nothing touched)."""
    out, round_ = parse(spec)
    if os.path.isdir(out) and os.path.isdir(cfg.out) and os.path.samefile(out, cfg.out):
        # --overwrite would move the parent's run.h5 and checkpoints away before they were read.
        raise ConfigError(f"--fork-from {show(spec)}: the parent is out = {show(cfg.out)} itself; a fork writes a "
                          f"new run and may not replace its parent: choose another out=...")
    parent = parent or read_parent(spec)
    differ = [k for k in checkpoint_checks.config_differences(parent.config, cfg) if k.split(".")[0] in SHAPE_KEYS]
    if differ:
        raise ConfigError(f"--fork-from {show(spec)}: {', '.join(differ)} differ from the parent's; a fork keeps "
                          f"the parent's {', '.join(SHAPE_KEYS)} (its clients and its model)")
    if round_ > cfg.rounds:
        raise ConfigError(f"rounds = {cfg.rounds}: below the fork's round {round_}")
    _check_counterfactual_start(cfg, parent.config, round_)
    resume.check_contents(parent.path, cfg)
    return ForkPoint(round_, parent.path, float(parent.attrs["wall_s"]), parent_out=parent.out,
                     parent_config_hash=str(parent.attrs["config_hash"]), parent_fingerprint=parent.fingerprint,
                     parent_config=parent.config)


def _check_counterfactual_start(cfg, parent_cfg, round_):
    """A counterfactual forked at ROUND changes the rounds from ROUND on; one that says it starts earlier
    (counterfactual.from_round) would be recorded as changing rounds the fork copies from its parent unchanged,
    unless the parent ran the same change."""
    cf = cfg.counterfactual
    if cf.inert or cf.from_round >= round_:
        return
    parent = (parent_cfg or {}).get("counterfactual") or {}
    same = (sorted(parent.get("drop") or []) == list(cf.drop) and sorted(parent.get("remove") or []) == list(cf.remove)
            and int(parent.get("from_round") or 0) == cf.from_round)
    if not same:
        raise ConfigError(f"counterfactual.from_round = {cf.from_round}: before the fork's round {round_}, whose "
                          f"earlier rounds are the parent's unchanged; set counterfactual.from_round={round_}")


def _check_parent_log(log, round_):
    """InputError (naming `log`) unless the parent's run file opens and holds the rows the fork copies
    (`ForkPoint.record`): found here, before the new run.h5 exists, not after it was created."""
    if not os.path.exists(log):
        raise InputError(f"--fork-from: {log} is missing; a fork copies the parent's rows up to round {round_}")
    check_input(log, f"--fork-from: {log}")
    try:
        with open_run(log) as f:
            rows = f["metrics/round"].shape[0]
    except Exception as e:  # noqa: BLE001 - truncated, not HDF5, no /metrics: the parent's log is unusable
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise InputError(f"--fork-from: {log} cannot be read as a run file ({reason}); a fork copies the "
                         f"parent's rows up to round {round_}") from None
    if rows < round_:
        raise InputError(f"--fork-from: {log} holds {rows} rounds, fewer than the fork's round {round_}; a fork "
                         f"copies the parent's rows up to it")


def plan_fork(cfg, comm, spec):
    """Collective: rank 0 chooses and checks the parent's checkpoint; every rank learns where it is."""
    point, round_ = decide(comm, lambda: (lambda p: (p, p.round))(choose(cfg, spec)))
    parent, _ = parse(spec)
    return point or resume.ResumePoint(int(round_), checkpoint.ckpt_path(parent, int(round_)), partial=True)
