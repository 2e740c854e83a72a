"""The words of `fedmpi verify` (the comparison itself is `fedmpi.analysis.verify`): both runs side by side, their
config differences, the largest relative differences against the tolerance, and the verdict with its
exit status."""

from __future__ import annotations

import warnings

import numpy as np

from fedmpi.analysis import report
from fedmpi.analysis.verify import FINAL_MODEL_STATUSES, TOLERANCE, compare, load_side
from fedmpi.config import RUNTIME_KEYS
from fedmpi.core.errors import EXIT_FAILED, EXIT_OK

MAX_DIFFERENCES_SHOWN = 40


# --- configs --------------------------------------------------------------------------------------------

def flatten(mapping, prefix=""):
    """{dotted key: value} of a nested mapping (lists are values)."""
    out = {}
    for key, value in mapping.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


_ABSENT = object()


def config_differences(a, b):
    """[(dotted key, value in A, value in B)] of every key whose value differs or is set in one only."""
    fa, fb = flatten(a.run.config), flatten(b.run.config)
    keys = sorted(set(fa) | set(fb))
    return [(k, fa.get(k, _ABSENT), fb.get(k, _ABSENT)) for k in keys if fa.get(k, _ABSENT) != fb.get(k, _ABSENT)]


def _value(v, limit=100):
    """A config value on one line; a long one loses its middle (both ends of a path say the most)."""
    text = "(absent)" if v is _ABSENT else "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit // 2 - 2] + " .. " + text[-(limit // 2 - 2):]


# --- the report -----------------------------------------------------------------------------------------

def _attr(side, key):
    value = side.run.attrs.get(key)
    return "-" if value is None or (isinstance(value, str) and not value) else report.one_line(value, 40)


def run_table(a, b):
    """Status, rounds, -n, versions and lineage of both runs, side by side."""
    def rounds(side):
        n = len(side.rounds)
        return f"{n} (1-{int(side.rounds[-1])})" if n else "0"

    def fork(side):
        parent = side.run.attrs.get("parent_out")
        return f"{parent} @ round {side.run.attrs.get('parent_round', '?')}" if parent else "-"

    rows = [("file", a.run.path, b.run.path), ("status", a.status, b.status),
            ("rounds", rounds(a), rounds(b)), ("-n (world_size)", _attr(a, "world_size"), _attr(b, "world_size"))]
    for key in ("device", "threads", "config_hash", "fedmpi_version"):
        rows.append((key.replace("_version", ""), _attr(a, key), _attr(b, key)))
    versions = sorted({k for s in (a, b) for k in s.run.attrs if k.startswith("version_")})
    rows += [(k[len("version_"):], _attr(a, k), _attr(b, k)) for k in versions]
    if any(s.run.attrs.get("parent_out") for s in (a, b)):
        rows.append(("fork of", fork(a), fork(b)))
    return _columns([("", a.label, b.label)] + rows, marks=True)


def _columns(rows, marks=False):
    """Left-aligned columns; with `marks`, rows (after the header and the file row) whose two values differ
    get a "*" in front."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, row in enumerate(rows):
        mark = "* " if marks and j > 1 and row[1] != row[2] else "  "   # not the header, not the file names
        lines.append((mark if marks else "") + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _differences_table(comparison):
    rows = [("figure", "largest relative difference", "at round", f"within {TOLERANCE:g}")]
    for name, rel, at in comparison.differences[:MAX_DIFFERENCES_SHOWN]:
        rows.append((name, "inf (measured in one run only, or shapes differ)" if np.isinf(rel) else f"{rel:.3g}",
                     "final" if name == "/model/global" else "-" if at is None else str(at),
                     "yes" if rel <= TOLERANCE else "NO"))
    more = len(comparison.differences) - MAX_DIFFERENCES_SHOWN
    return _columns(rows) + (f"\n  ... and {more} more" if more > 0 else "")


def verdict(a, b, comparison):
    """(the verdict line, exit status)."""
    if not comparison.common:
        return "no round in common yet: nothing to compare", EXIT_OK
    last = comparison.common[-1]
    how = "model fingerprint" if comparison.basis == "fingerprints" else "per-round metrics and final model"
    if comparison.identical:
        return f"identical through round {last} ({len(comparison.common)} rounds compared by {how})", EXIT_OK
    if comparison.first_difference is None:
        where = "the final models differ although every compared round agrees"
    else:
        r = comparison.first_difference
        before = [c for c in comparison.common if c < r]
        what = f" ({', '.join(comparison.differing_figures)})" if comparison.differing_figures else ""
        where = (f"first difference at round {r}{what} by {how}, "
                 + (f"identical through round {before[-1]}" if before else "the first round both have"))
    if a.world_size != b.world_size and comparison.within_tolerance:
        return (f"within the documented tolerance of {TOLERANCE:g} relative across process counts; not "
                f"bit-identical: {where}"), EXIT_OK
    return f"differ: {where}", EXIT_FAILED


def _promise(a, b):
    """What docs/explanation/determinism.md promises for two runs at different -n."""
    where = f"process counts differ (-n {a.world_size} and -n {b.world_size})"
    if a.threads is not None and a.threads == b.threads:
        return (f"{where} at the same thread count ({a.threads}): on CPUs fedmpi computes identical models "
                f"(docs/explanation/determinism.md); on GPUs, agreement to {TOLERANCE:g} relative")
    return (f"{where}, thread counts {a.threads} and {b.threads}: fedmpi promises agreement to {TOLERANCE:g} "
            f"relative (docs/explanation/determinism.md), not identical bits; fix runtime.threads for identical models")


def format_report(a, b, comparison):
    lines = [run_table(a, b)]
    for side in (a, b):
        if side.status not in FINAL_MODEL_STATUSES:
            lines.append(f"note: {side.label} is {side.status}: compared up to its last complete round")
    lines += [f"note: {n}" for n in comparison.notes]
    if len(lines) > 1:
        lines.insert(1, "")
    diffs = config_differences(a, b)
    lines.append(f"\nconfig differences ({len(diffs)}; * = run-time key, does not change the computation):"
                 if diffs else "\nconfig: no differences")
    if diffs:
        rows = [("", "key", a.label, b.label)] + [("*" if k.split(".")[0] in RUNTIME_KEYS else "", k,
                                                   _value(va), _value(vb)) for k, va, vb in diffs]
        lines.append(_columns(rows))
    lines.append(f"\nfinal model (/model/global): {comparison.model}")
    line, code = verdict(a, b, comparison)
    if a.world_size != b.world_size:
        lines.append(f"\n{_promise(a, b)}")
    if comparison.differences and (not comparison.identical or a.world_size != b.world_size):
        lines += ["", _differences_table(comparison)]
    lines += ["", f"verdict: {line}"]
    return "\n".join(lines), code


def verify_command(path_a, path_b, out) -> int:
    a, b = load_side(path_a, "A"), load_side(path_b, "B")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        text, code = format_report(a, b, compare(a, b))
    print(text, file=out)
    return code
