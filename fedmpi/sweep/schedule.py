"""Rank 0's book of a sweep: which experiment goes next to which free ranks, what each experiment's status is
(written to the index at every change), and the progress lines.

Order: the experiments to run are queued largest first, by ranks, then by estimated size
(fedmpi.sweep.configs.size), then in the spec's order. A set of free ranks takes the first queued experiment
that fits it (so smaller ones fill ranks a larger one cannot use yet), on as few nodes as possible: the node
with the fewest free ranks that still holds the whole group, else the nodes with the most free ranks first.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from fedmpi.core.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USAGE
from fedmpi.sweep import index

DONE = ("finished", "failed", "diverged", "refused")


def now_text():
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def status_of(code, run_status):
    """The index status of an experiment that ended with exit `code` (`run_status`: its run.h5's status)."""
    if code == 0:
        return "finished"
    if code == EXIT_PREEMPTED:
        return "preempted"
    if code == EXIT_INTERRUPTED:
        return "interrupted"
    if code == EXIT_USAGE and run_status in ("", "running"):
        return "refused"
    return run_status if run_status in ("diverged", "failed") else "failed"


def pick_ranks(free, k, node_of):
    """`k` of the `free` ranks on as few nodes as possible (see the module docstring), in rank order."""
    by_node = {}
    for r in sorted(free):
        by_node.setdefault(node_of[r], []).append(r)
    fitting = [ranks for ranks in by_node.values() if len(ranks) >= k]
    if fitting:
        return min(fitting, key=lambda ranks: (len(ranks), ranks[0]))[:k]
    chosen = []
    for ranks in sorted(by_node.values(), key=lambda ranks: (-len(ranks), ranks[0])):
        chosen += ranks[: k - len(chosen)]
    return sorted(chosen)


class Schedule:
    def __init__(self, out, rows, ranks, sizes, modes, workers, say):
        """`rows`: index.Row per experiment with its status as found; `ranks`, `sizes`, `modes`: per experiment;
        `workers`: the ranks that run experiments."""
        self.out, self.rows, self.ranks, self.sizes, self.modes = out, rows, ranks, sizes, modes
        self.workers, self.say = workers, say
        self.queue = sorted((i for i, row in enumerate(rows) if row.status == "pending"),
                            key=lambda i: (-ranks[i], -sizes[i], i))
        self.running = {}        # experiment -> (monotonic start, ranks)
        self.finished_work = []  # (rank-seconds, size) of the experiments finished in this launch

    def pick(self, free, node_of):
        """(experiment, its ranks) for the first queued experiment that the `free` ranks can take, or None."""
        for i in self.queue:
            if self.ranks[i] <= len(free):
                return i, pick_ranks(free, self.ranks[i], node_of)
        return None

    def start(self, i, ranks):
        self.queue.remove(i)
        self.running[i] = (time.monotonic(), list(ranks))
        row = self.rows[i]
        row.status, row.attempts, row.message, row.exit_code = "running", row.attempts + 1, "", ""
        row.started = row.started or now_text()
        how = {1: ", continued from its checkpoint", 2: ", begun again"}.get(self.modes[i], "")
        self.say(f"started {row.name} on rank{'s' if len(ranks) > 1 else ''} {_span(ranks)}{how}")
        self.write()

    def end(self, i, code, run_status, message, wall_s):
        began, ranks = self.running.pop(i)
        row = self.rows[i]
        row.status, row.exit_code, row.ended = status_of(code, run_status), str(code), now_text()
        row.wall_s += wall_s
        if row.status == "preempted":   # the index's own short form of the stop line's how-to-continue
            message = f"{message.split(';')[0]}; the same sweep started again continues it"
        row.message = message if row.status != "finished" else ""
        if row.status == "finished":
            self.finished_work.append((wall_s * len(ranks), self.sizes[i]))
        tail = f": {message}" if row.status not in ("finished", "preempted") and message else ""
        self.say(f"{row.status} {row.name} in {wall_s:.1f} s (exit {code}){tail}")
        self.say(self.summary())
        self.write()

    def interrupt_running(self, message):
        """Every running experiment marked interrupted (rank 0 is about to end the launch)."""
        for i in list(self.running):
            row = self.rows[i]
            row.status, row.exit_code, row.ended, row.message = "interrupted", "", now_text(), message
        self.running.clear()
        self.write()

    def write(self):
        index.write(self.out, self.rows)

    def counts(self):
        done = sum(row.status == "finished" for row in self.rows)
        failed = sum(row.status in ("failed", "diverged", "refused") for row in self.rows)
        return done, len(self.running), failed, len(self.queue)

    def summary(self):
        done, running, failed, left = self.counts()
        return f"{done} done, {running} running, {failed} failed, {left} left; {self.time_left()}"

    def time_left(self):
        """Rank-seconds per unit of size, from this launch's finished experiments, times the size still to do
        (the queue, and what the running ones have not done yet), over the worker ranks."""
        work = sum(w for w, _ in self.finished_work)
        done_size = sum(s for _, s in self.finished_work)
        if not self.queue and not self.running:
            return "nothing left"
        if work <= 0 or done_size <= 0:
            return "time left known after the first experiment finishes"
        rate = work / done_size
        left = sum(self.sizes[i] * rate for i in self.queue)
        now = time.monotonic()
        left += sum(max(0.0, self.sizes[i] * rate - (now - began) * len(ranks))
                    for i, (began, ranks) in self.running.items())
        return f"about {_duration(left / max(1, self.workers))} left"

    def exit_code(self):
        """0 when every experiment of the spec finished; 1 otherwise (the index says which did not)."""
        return 0 if all(row.status == "finished" for row in self.rows) else 1


def _span(ranks):
    ranks = sorted(ranks)
    if len(ranks) > 1 and ranks[-1] - ranks[0] == len(ranks) - 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _duration(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
