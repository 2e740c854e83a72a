"""Which runs a grouped result is made of, and the one round it compares them at: the rule that `summary`,
`table`, `group_summary`, `sweep_rows` (`fedmpi report --by`, its CSV) and every grouped figure share.

Status, as the analysis reads it from run.h5 (`run_status`, `category`):
  finished  status finished, the model finite throughout
  diverged  status diverged, or finished after a non-finite model (runtime.on_nonfinite: continue records the
            first such round as run.h5's `nonfinite_round`)
  failed    status failed
  running   still being written, or stopped early (running, preempted, interrupted): counted with the round it
            reached
A grouped result uses the finished runs; `include` adds others ("diverged", "running,failed", "all"). Each
group says what it left out: "+1 diverged, +2 running at rounds 4-6".

The round: every run of a comparison is taken at the same round, by default the last round that every one of
them evaluated (FedSkip with delta 3 and rounds 10 evaluates at 3, 6, 9: FedAvg beside it is taken at round 9
too), or the round the caller names (`at_round`). A run's figures at round R are computed from its first R
rounds (`at_round_of`): final_acc is round R's test accuracy, bytes_moved the bytes up to R, and so on.
"""

from __future__ import annotations

import numpy as np

from fedmpi.analysis import report
from fedmpi.analysis.report import run_status  # noqa: F401 - the status this module groups by, public here
from fedmpi.core.errors import InputError

STATUSES = ("finished", "diverged", "failed", "running")
DEFAULT = ("finished",)
ALL = "all"


class SelectionError(InputError, ValueError):
    """A bad `include` or `at_round`: one line naming the option and what is valid."""


def category(status):
    """finished, diverged or failed as they are; anything else (running, preempted, interrupted, a file
    without a status) is a run that did not reach its end: running."""
    return status if status in STATUSES else "running"


def included(include=None):
    """The categories kept: finished, plus those `include` names (a name, a comma-separated list, a list of
    names, or "all")."""
    if include is None:
        return set(DEFAULT)
    names = include.split(",") if isinstance(include, str) else list(include)
    names = [str(n).strip() for n in names if str(n).strip()]
    wrong = [n for n in names if n not in STATUSES + (ALL,)]
    if wrong:
        raise SelectionError(f"include = {', '.join(wrong)}: must be {', '.join(STATUSES[1:])} (comma-separated) "
                             f"or {ALL}")
    return set(STATUSES) if ALL in names else set(DEFAULT) | set(names)


def left_out_text(left):
    """"+1 diverged, +2 running at rounds 4-6" of the left-out runs' (category, rounds reached); "" for none."""
    parts = []
    for name in STATUSES:
        reached = sorted(int(r) for c, r in left if c == name)
        if not reached:
            continue
        text = f"+{len(reached)} {name}"
        if name == "running":
            text += (f" at round {reached[0]}" if reached[0] == reached[-1]
                     else f" at rounds {reached[0]}-{reached[-1]}")
        parts.append(text)
    return ", ".join(parts)


def split(items, statuses, reached, include=None):
    """(kept items, the left-out text) of `items`, given each one's status and rounds reached."""
    keep = included(include)
    kept, left = [], []
    for item, status, rounds_done in zip(items, statuses, reached):
        if category(status) in keep:
            kept.append(item)
        else:
            left.append((category(status), rounds_done))
    return kept, left_out_text(left)


def split_runs(runs, include=None):
    """(kept runs, the left-out text) of Run objects (or of (Run, anything) pairs, kept as given)."""
    plain = [r[0] if isinstance(r, tuple) else r for r in runs]
    return split(runs, [run_status(r.attrs) for r in plain], [len(r.metrics.get("round", ())) for r in plain],
                 include)


def evaluated_rounds(run):
    """The 1-based rounds at which the run's test accuracy was measured."""
    acc = np.asarray(run.metrics.get("test_acc", ()), dtype=np.float64)
    rounds = np.asarray(run.metrics.get("round", ()), dtype=np.float64)[:len(acc)]
    if np.ndim(acc) != 1:
        return ()
    return tuple(int(r) + 1 for r in rounds[np.isfinite(acc[:len(rounds)])])


def comparison_round(evaluated, reached, names=(), at_round=None):
    """(round, how it was chosen) of a comparison of runs with these evaluated rounds and rounds reached:
    `at_round` checked against every run, or the last round that every run evaluated (where none is common to
    all, the earliest of their last evaluations: each run is then taken at its last evaluation up to it)."""
    reached = [int(r) for r in reached]
    if at_round is not None:
        if isinstance(at_round, bool) or not isinstance(at_round, (int, np.integer)) or at_round < 1:
            raise SelectionError(f"at_round = {at_round!r}: must be a round number, 1 or more")
        short = [(n, r) for n, r in zip(names or [""] * len(reached), reached) if r < at_round]
        if short:
            name, rounds_done = short[0]
            raise SelectionError(f"at_round = {at_round}: the run {name} reached round {rounds_done} (valid: 1 to "
                                 f"{min(reached)}, the rounds every run compared has)")
        return int(at_round), "the round asked for"
    sets = [set(e) for e in evaluated if len(e)]
    if not reached:
        return 0, "no run"
    if not sets:
        return min(reached), "no run evaluated its test accuracy: their last round"
    common = set.intersection(*sets)
    if common:
        return max(common), "the last round evaluated by every run compared"
    return (min(max(s) for s in sets),
            "no round was evaluated by every run: each is taken at its last evaluation up to this round")


def runs_round(runs, at_round=None):
    """`comparison_round` of Run objects."""
    return comparison_round([evaluated_rounds(r) for r in runs], [len(r.metrics.get("round", ())) for r in runs],
                            [r.name for r in runs], at_round)


def at_round_of(run, round_):
    """The run as it was at the end of round `round_` (1-based): its rows of the later rounds left out (the run
    itself where it has none)."""
    rounds = np.asarray(run.metrics.get("round", ()), dtype=np.float64)
    rows = int((rounds < round_).sum())
    if rows == len(rounds):
        return run
    cut = report.Run(run.path, run.attrs, {k: v[:rows] for k, v in run.metrics.items()}, run.partition,
                     run.server_partition, run.metric_attrs, {k: v[:rows] for k, v in run.timing.items()},
                     run.groups)
    for parsed in ("config", "method"):         # already parsed: the same for every round
        if parsed in run.__dict__:
            cut.__dict__[parsed] = run.__dict__[parsed]
    return cut


def note(round_, how):
    """The line a report prints under a grouped table."""
    if round_ == 0:
        return "no run was used: every group left its runs out by status (include= or --include adds them)"
    return f"every group is compared at round {round_} ({how})"


def group_label(label, n, left_out):
    """A figure's label of a group: "fedavg (n=2, +1 diverged)"."""
    return f"{label} (n={n}{', ' + left_out if left_out else ''})"
