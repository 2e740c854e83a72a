"""Paired measurement: the order of the launches and the statistics of the benchmark, as pure
functions (tested on hand-computed numbers in tests/test_bench_paired.py).

On a shared host the same loop varies by a third between runs, so a ratio of two unpaired medians says
little. The benchmark therefore runs the baseline (the reference loop; fedmpi at -n 1 for QS) right before
every fedmpi run, A B A B ..., and reports for each fedmpi row the median of the per-pair ratios with their
min-max. The host's own variation is the spread of the baseline's repeats, printed beside it.
"""

from __future__ import annotations

import math
import statistics


def launch_order(rows, pairs):
    """The launches of one workload: for every pair p and every fedmpi row r (in order) the baseline, then
    r: [(None, p), (r, p), ...], None standing for the baseline. Each fedmpi run has its own baseline run
    just before it, so the two see the same state of the host."""
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    return [item for p in range(pairs) for row in rows for item in ((None, p), (row, p))]


def later_rounds(seconds):
    """The figure of one run: the median of its per-round seconds from the second round on (the first is
    warm-up); the first round itself where the run has only one."""
    seconds = list(seconds)
    if not seconds:
        raise ValueError("a run without rounds")
    return statistics.median(seconds[1:] if len(seconds) > 1 else seconds)


def pair_ratio(baseline, run, key="rounds"):
    """One pair's ratio run / baseline of seconds per round (`key`: "rounds", wall; "busy_rounds", CPU).
    Paced by round (both samples "paced", as many rounds each), the median over rounds 2.. of the per-round
    ratios: round t of the run against round t of the baseline, a second apart. Otherwise the ratio of the
    runs' figures (`later_rounds`)."""
    a, b = list(baseline[key]), list(run[key])
    if baseline.get("paced") and run.get("paced") and len(a) == len(b) > 1:
        if any(x <= 0 for x in a[1:]):
            raise ValueError("baseline rounds must take positive time")
        return statistics.median(y / x for x, y in zip(a[1:], b[1:]))
    return pair_ratios([later_rounds(a)], [later_rounds(b)])[0]


def pair_ratios(baseline, runs):
    """Per-pair ratios run / baseline of two equally long lists of per-run figures."""
    if len(baseline) != len(runs) or not runs:
        raise ValueError(f"need as many baseline figures as runs, got {len(baseline)} and {len(runs)}")
    if any(b <= 0 for b in baseline):
        raise ValueError("baseline figures must be positive")
    return [r / b for b, r in zip(baseline, runs)]


def spread(values):
    """(median, min, max) of a non-empty list."""
    values = list(values)
    if not values:
        raise ValueError("no values")
    return statistics.median(values), min(values), max(values)


def host_variation(baseline):
    """How much the baseline's own repeats varied: (max - min) / median (0.0 for a single repeat)."""
    med, lo, hi = spread(baseline)
    return (hi - lo) / med if med > 0 else math.nan


# The paired targets: (workload, row) -> (figure, bound). `ratio`: the run's seconds per round over the
# baseline's in the same pair, at most the bound; `speedup`: the inverse (clients per second over the
# reference's), at least the bound. Judged on the median of the pairs.
TARGETS = {
    ("W1", "-n 2"): ("ratio", 0.53), ("W1", "-n 3"): ("ratio", 0.53),
    ("QS", "-n 3"): ("ratio", 0.53),
    ("W2", "-n 2"): ("speedup", 8.0), ("W2", "-n 3"): ("speedup", 8.0),
    ("W5", "-n 2"): ("ratio", 0.55), ("W5", "-n 3"): ("ratio", 0.55),
}


def target_status(workload, row, median_ratio, targets=TARGETS):
    """'met (<= 0.53)', 'NOT met (>= 8x)' or '' where the row has no target."""
    if (workload, row) not in targets:
        return ""
    kind, bound = targets[(workload, row)]
    if kind == "ratio":
        return f"{'met' if median_ratio <= bound else 'NOT met'} (<= {bound:g})"
    speedup = 1.0 / median_ratio
    return f"{'met' if speedup >= bound else 'NOT met'} (>= {bound:g}x)"


def markdown_table(header, rows):
    """A GitHub markdown table of string cells."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


BEGIN, END = "<!-- bench:paired:begin -->", "<!-- bench:paired:end -->"


def replace_marked(doc, block, begin=BEGIN, end=END):
    """`doc` with the lines between its marker lines `begin` and `end` (each alone on its line; a marker
    quoted in prose does not count) replaced by `block`, markers kept; ValueError where either is missing
    or they are out of order (so that nothing is written)."""
    lines = doc.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == begin]
    stops = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(stops) != 1 or stops[0] < starts[0]:
        raise ValueError(f"needs one line {begin} and, after it, one line {end}")
    return "\n".join(lines[: starts[0] + 1] + block.strip("\n").split("\n") + lines[stops[0]:])


# --- one workload's rows -----------------------------------------------------------------------------

def _nan_median(values):
    values = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else math.nan


def summarize_baseline(samples):
    """The baseline's row figures from its runs (every repeat of every pair)."""
    per_run = [later_rounds(s["rounds"]) for s in samples]
    med, lo, hi = spread(per_run)
    return {"runs": len(samples), "s_round": med, "ratio": (1.0, lo / med, hi / med), "busy_ratio": 1.0,
            "variation": host_variation(per_run), **_common(samples)}


def summarize_row(baseline, samples, training_ranks=None):
    """A fedmpi row from its runs and the baseline run of each one's pair (equally long lists)."""
    if len(baseline) != len(samples) or not samples:
        raise ValueError(f"need a baseline run per run, got {len(baseline)} and {len(samples)}")
    ratios = [pair_ratio(b, s) for b, s in zip(baseline, samples)]
    busy = [pair_ratio(b, s, "busy_rounds") for b, s in zip(baseline, samples)]
    med = spread(ratios)
    out = {"runs": len(samples), "s_round": statistics.median(later_rounds(s["rounds"]) for s in samples),
           "ratio": med, "busy_ratio": statistics.median(busy), "ratios": ratios, **_common(samples)}
    # eff: the best a run can do, the baseline shared by the ranks that train, over the measured ratio
    ranks = training_ranks or samples[0].get("training_ranks")
    out["eff"] = 1.0 / (ranks * med[0]) if ranks else math.nan
    return out


def _common(samples):
    first = samples[0]
    return {"first_s": statistics.median(s["rounds"][0] for s in samples),
            "whole_s": statistics.median(s["whole_s"] for s in samples),
            "cpu_s": statistics.median(s["cpu_s"] for s in samples),
            "server_cpu_s": _nan_median([s["server_cpu_s"] for s in samples]),
            "rss_ranks": first["peak_rss_mb"], "acc": first["acc"], "device": first["device"],
            "mpi_mb": first["mpi_bytes_per_round"] / 1e6,
            "fl_mb": first["fl_bytes"] / 1e6 / max(len(first["rounds"]), 1)}


HEADER = ("workload", "run", "runs", "s/round", "x base", "(min-max)", "busy x", "eff", "clients/s", "speed-up",
          "1st s", "whole s", "cpu s", "rank 0 cpu", "peak MB/rank", "MPI MB/rnd", "FL MB/rnd", "device", "acc",
          "target")


def _fig(value, fmt):
    return "-" if isinstance(value, float) and math.isnan(value) else format(value, fmt)


def format_row(workload, label, s, per_round, is_baseline=False, targets=TARGETS):
    """One table row of `summarize_row` / `summarize_baseline` figures. `x base` is the median of the pairs'
    ratios to the baseline (min-max beside it; for the baseline itself, its runs' spread about their median,
    the host's variation); `speed-up` is the baseline's seconds per round over the run's (clients per second
    over the baseline's)."""
    med, lo, hi = s["ratio"]
    target = "" if is_baseline else target_status(workload, label, med, targets)
    return (workload, label, str(s["runs"]), f"{s['s_round']:.4f}", f"{med:.3f}", f"{lo:.3f}-{hi:.3f}",
            f"{s['busy_ratio']:.3f}", _fig(s.get("eff", math.nan), ".2f"), f"{per_round / s['s_round']:.0f}",
            f"{1.0 / med:.2f}", f"{s['first_s']:.2f}", f"{s['whole_s']:.1f}", f"{s['cpu_s']:.1f}",
            _fig(s["server_cpu_s"], ".1f"), "/".join(f"{r:.0f}" for r in s["rss_ranks"]), _fig(s["mpi_mb"], ".3g"),
            _fig(s["fl_mb"], ".3g"), s["device"], f"{s['acc']:.4f}", target)


MARKDOWN_HEADER = ("workload", "run", "runs", "s/round", "x baseline: median of pairs (min-max)", "clients/s",
                   "speed-up", "target")


def markdown_rows(rows):
    """The markdown table's rows from `format_row` rows."""
    return [(r[0], f"`{r[1]}`" if r[1].startswith("-n") else r[1], r[2], r[3], f"{r[4]} ({r[5]})", r[8], r[9],
             r[19] or "-") for r in rows]
