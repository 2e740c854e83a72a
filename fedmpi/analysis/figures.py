"""Every summary figure of a run, with its one-line definition: the single list that `fedmpi report` (its table,
its --help, its CSV), `fedmpi.analysis.runs` (the DataFrame's columns) and docs/how-to/analysis.md take them from.

A figure belongs to a family: `accuracy` and `cost` figures exist for every run; the other families'
(personalization, fairness, robustness, privacy, secure aggregation, deployment) exist where the run recorded
what they are computed from, and are NaN elsewhere. Rounds are 1-based wherever a figure is a round (the
files store them from 0: /metrics/round holds 0 for the first round).

For a next-token task (data.name shakespeare with any model, or model.name causal_lm on any data) the test
accuracy is the token accuracy, and the perplexity figures (exp of the mean test cross-entropy, as run.h5
records it: fedmpi.core.perplexity) are measured; LOWER_IS_BETTER names the figures whose best value is the
smallest (a best perplexity is the lowest).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

WINDOW = 20          # evaluations in `acc_last20_mean` (the FSL paper's "final accuracy")
RISE_FRACTION = 0.9  # rise_round: first round whose rolling accuracy reaches 90% of acc_last20_mean
TAIL = 0.1           # the share of the last rounds that the *_tail10 figures average over
HALF = 0.5           # secagg_rounds_half_clipped: rounds where more than this share of updates was clipped

FAMILIES = ("accuracy", "cost", "personalization", "fairness", "robustness", "privacy", "secure aggregation",
            "deployment")


@dataclass(frozen=True)
class Figure:
    name: str
    family: str
    definition: str
    compute: Callable       # Run -> float (NaN where the run has nothing to compute it from)
    unit: str = "number"    # how the report prints it: share, bytes, seconds, round, count, number


# --- what the figures are computed from -------------------------------------------------------------------

def series(run, name):
    """A per-round figure of /metrics as float64 (empty where the run did not record it or it is not 1-D)."""
    values = run.metrics.get(name)
    if values is None or np.ndim(values) != 1:
        return np.zeros(0)
    return np.asarray(values, dtype=np.float64)


def last(values):
    """The last measured value (NaN where none was; an infinite one, e.g. the epsilon of a run without noise,
    counts)."""
    measured = values[~np.isnan(values)]
    return float(measured[-1]) if len(measured) else math.nan


def finite_mean(values):
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else math.nan


def finite_sum(values):
    finite = values[np.isfinite(values)]
    return float(finite.sum()) if len(finite) else math.nan


def tail_mean(values, tail=TAIL):
    """The mean of the finite values of the last ceil(tail x rounds) rounds (NaN when none is finite there)."""
    if not len(values):
        return math.nan
    window = values[-max(1, math.ceil(tail * len(values))):]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(window)) if np.isfinite(window).any() else math.nan


def rolling_mean(values, window=WINDOW):
    values = np.asarray(values, dtype=np.float64)
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (csum[idx] - csum[lo]) / (idx - lo)


def evaluations(run, name="test_acc"):
    """(0-based rounds, values) of the rounds where the figure was measured."""
    values = series(run, name)
    rounds = np.asarray(run.metrics.get("round", []), dtype=np.float64)[:len(values)]
    keep = np.isfinite(values)
    return rounds[keep], values[keep]


def acc_last_mean(run, window=WINDOW):
    _, acc = evaluations(run)
    return float(acc[-window:].mean()) if len(acc) else math.nan


def rise_round(run):
    rounds, acc = evaluations(run)
    if not len(acc):
        return math.nan
    reached = np.flatnonzero(rolling_mean(acc) >= RISE_FRACTION * acc_last_mean(run))
    return float(rounds[reached[0]] + 1) if len(reached) else math.nan


def lowest(values):
    """The smallest measured value (NaN where none was): the best of a figure where lower is better."""
    measured = values[~np.isnan(values)]
    return float(measured.min()) if len(measured) else math.nan


def bytes_moved(metrics):
    """Cumulative bytes moved (up + down) at the end of each round."""
    up, down = (np.nan_to_num(np.asarray(metrics.get(k, []), dtype=np.float64)) for k in ("bytes_up", "bytes_down"))
    return np.cumsum(up + down)


def target_figures(run, target):
    """(1-based round, bytes moved) until the first evaluation whose test accuracy reaches `target` (NaN if
    none did)."""
    acc = series(run, "test_acc")
    reached = np.flatnonzero(np.nan_to_num(acc, nan=-np.inf) >= target)
    if not len(reached):
        return math.nan, math.nan
    i = reached[0]
    return float(run.metrics["round"][i] + 1), float(bytes_moved(run.metrics)[i])


def mean_client_emd(stats):
    """Sample-weighted mean of the clients' EMD to the whole training set (NaN without partition data)."""
    if "emd" not in stats or "samples" not in stats or np.shape(stats["emd"]) != np.shape(stats["samples"]):
        return math.nan
    samples = np.asarray(stats["samples"], dtype=np.float64)
    return float((np.asarray(stats["emd"]) * samples).sum() / max(samples.sum(), 1))


def last_local(run, name):
    """A local-evaluation figure at the last round that had a local evaluation."""
    return last(series(run, name))


def below_global_count(run):
    """Clients below the global model at the last local evaluation: the logged share times the clients that
    evaluation covered (/clients/local_acc's finite entries of that round)."""
    share = series(run, "local_below_global")
    rows = np.flatnonzero(np.isfinite(share))
    if not len(rows):
        return math.nan
    evaluated = run.client_figure("local_acc")
    if evaluated is None or rows[-1] >= len(evaluated):
        return math.nan
    return float(round(share[rows[-1]] * np.isfinite(evaluated[rows[-1]]).sum()))


def _config(run, dotted, default=None):
    node = run.config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _attr_number(run, name):
    try:
        return float(run.attrs[name])
    except (KeyError, TypeError, ValueError):
        return math.nan


# The run attributes of the mechanisms with an accountant (client-level DP, secure aggregation's distributed
# noise): `{prefix}_epsilon` bounds the released model, `{prefix}_epsilon_rounds` the noised rounds alone where
# a fork turned the mechanism on part-way (fedmpi.uploads.forked).
EPSILON_PREFIXES = ("privacy", "secagg")


def model_epsilon(run):
    """The whole model's epsilon as run.h5 records it: infinite for a fork that turned the noise on part-way
    (its note says why). A run file without the attribute: the last per-round /metrics/epsilon."""
    for prefix in EPSILON_PREFIXES:
        if f"{prefix}_epsilon" in run.attrs:
            return _attr_number(run, f"{prefix}_epsilon")
    return last(series(run, "epsilon"))


def epsilon_note(run):
    """Why the model's epsilon is infinite where a fork made it so (run.h5's `{prefix}_epsilon_note`), else None."""
    for prefix in EPSILON_PREFIXES:
        note = run.attrs.get(f"{prefix}_epsilon_note")
        if note is not None:
            return note.decode() if isinstance(note, bytes) else str(note)
    return None


def noised_rounds_epsilon(run):
    """The epsilon of the rounds that had the noise: a fork's `{prefix}_epsilon_rounds`, else the model's."""
    for prefix in EPSILON_PREFIXES:
        if f"{prefix}_epsilon_rounds" in run.attrs:
            return _attr_number(run, f"{prefix}_epsilon_rounds")
    return model_epsilon(run)


def _delta(run):
    """privacy_delta; secure aggregation's distributed noise keeps its delta in the config (secagg.delta)."""
    if "privacy_delta" in run.attrs:
        return _attr_number(run, "privacy_delta")
    value = _config(run, "secagg.delta")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _dropouts(run):
    """Clients that dropped out (deployment realism: /clients/dropped), summed over rounds."""
    if "returned" not in run.metrics and "sim_time_s" not in run.metrics:
        return math.nan
    dropped = run.client_figure("dropped")
    return math.nan if dropped is None else float(np.nansum(dropped))


def _half_clipped_rounds(run):
    clipped = series(run, "secagg_clipped_fraction")
    return float((clipped > HALF).sum()) if np.isfinite(clipped).any() else math.nan


def _malicious(run):
    if "attack" not in run.groups:
        return math.nan
    return float(len(run.groups["attack"].get("malicious", ())))


def _secagg_sum(run, name):
    return finite_sum(series(run, name)) if name in run.metrics else math.nan


def _secagg_time(run):
    unmask, mask = series(run, "secagg_unmask_s"), series(run, "secagg_client_mask_s")
    if not len(unmask):
        return math.nan
    return finite_sum(unmask) + (finite_sum(mask) if len(mask) else 0.0)


FIGURES = (
    Figure("rounds_done", "accuracy", "rounds logged in /metrics (a running run counts its complete rounds)",
           lambda r: float(len(r.metrics.get("round", []))), "count"),
    Figure("final_acc", "accuracy", "test accuracy of the global model at the last evaluated round (for a "
           "next-token task: the token accuracy)", lambda r: last(series(r, "test_acc")), "share"),
    Figure("final_loss", "accuracy", "test loss of the global model at the last evaluated round",
           lambda r: last(series(r, "test_loss"))),
    Figure("acc_last20_mean", "accuracy", f"mean test accuracy over the last {WINDOW} evaluations (fewer where "
           f"fewer were made; the FSL paper's final accuracy)", acc_last_mean, "share"),
    Figure("best_acc", "accuracy", "highest test accuracy over all evaluations",
           lambda r: float(np.max(evaluations(r)[1])) if len(evaluations(r)[1]) else math.nan, "share"),
    Figure("rise_round", "accuracy", f"first round (1-based) whose {WINDOW}-evaluation rolling mean test "
           f"accuracy reaches {RISE_FRACTION:.0%} of acc_last20_mean", rise_round, "round"),
    Figure("final_perplexity", "accuracy", "next-token task: test perplexity exp(mean test cross-entropy) of the "
           "global model at the last evaluated round (lower is better)",
           lambda r: last(series(r, "test_perplexity"))),
    Figure("best_perplexity", "accuracy", "next-token task: lowest test perplexity over all evaluations",
           lambda r: lowest(series(r, "test_perplexity"))),
    Figure("uploads", "cost", "client updates the server counted, summed over the rounds",
           lambda r: float(np.nansum(series(r, "uploads"))), "count"),
    Figure("bytes_moved", "cost", "bytes sent up and down over the run (/metrics bytes_up + bytes_down, "
           "secure aggregation's protocol messages included)",
           lambda r: float(np.nansum(series(r, "bytes_up")) + np.nansum(series(r, "bytes_down"))), "bytes"),
    Figure("wall_s", "cost", "seconds from the start of training to the end of the last logged round",
           lambda r: last(series(r, "wall_s")), "seconds"),
    Figure("emd", "cost", "sample-weighted mean earth mover's distance of the clients' label distributions to "
           "the whole training set (the split's skew)", lambda r: mean_client_emd(r.partition), "number"),
    Figure("local_acc_mean", "personalization", "sample-weighted mean of the clients' accuracy on their own test "
           "splits, at the last local evaluation", lambda r: last_local(r, "local_acc_mean"), "share"),
    Figure("local_acc_worst10", "personalization", "mean local accuracy of the worst 10% of the evaluated "
           "clients, at the last local evaluation", lambda r: last_local(r, "local_acc_worst10"), "share"),
    Figure("local_acc_std", "personalization", "standard deviation of the clients' local accuracies (their "
           "spread), at the last local evaluation", lambda r: last_local(r, "local_acc_std"), "share"),
    Figure("local_perplexity_mean", "personalization", "next-token task: exp of the sample-weighted mean loss "
           "of the clients on their own test splits (lower is better), at the last local evaluation",
           lambda r: last_local(r, "local_perplexity_mean")),
    Figure("local_below_global_n", "personalization", "clients whose local accuracy is below the global "
           "model's on their own split, at the last local evaluation", below_global_count, "count"),
    Figure("local_acc_unweighted", "fairness", "mean of the clients' local accuracies, every client counted "
           "once, at the last local evaluation", lambda r: last_local(r, "local_acc_unweighted"), "share"),
    Figure("local_acc_worst", "fairness", "the worst client's local accuracy, at the last local evaluation",
           lambda r: last_local(r, "local_acc_worst"), "share"),
    Figure("backdoor_acc", "robustness", "attack success: share of triggered non-target test samples the "
           "global model classifies as the backdoor's target, at the last evaluation",
           lambda r: last(series(r, "backdoor_acc")), "share"),
    Figure("backdoor_acc_tail10", "robustness", "backdoor_acc averaged over the last 10% of rounds",
           lambda r: tail_mean(series(r, "backdoor_acc")), "share"),
    Figure("test_acc_tail10", "robustness", "test accuracy averaged over the last 10% of rounds, for a run under "
           "attack (the robustness study's main-task figure)",
           lambda r: tail_mean(series(r, "test_acc")) if "attack" in r.groups else math.nan, "share"),
    Figure("malicious", "robustness", "malicious clients the attack drew (/attack/malicious)", _malicious, "count"),
    Figure("detect_precision", "robustness", "share of the clients the aggregator excluded that were malicious, "
           "mean over the rounds", lambda r: finite_mean(series(r, "detect_precision")), "share"),
    Figure("detect_recall", "robustness", "share of the malicious clients the aggregator excluded, mean over "
           "the rounds", lambda r: finite_mean(series(r, "detect_recall")), "share"),
    Figure("epsilon", "privacy", "the whole model's privacy guarantee epsilon (at privacy_delta), as run.h5 "
           "records it (privacy_epsilon or secagg_epsilon): infinite for a fork that turned the noise on part-way",
           model_epsilon, "number"),
    Figure("noised_rounds_epsilon", "privacy", "the epsilon of the noised rounds alone: for such a fork its "
           "privacy_epsilon_rounds (secagg_epsilon_rounds), what /metrics/epsilon ends at; else equal to epsilon",
           noised_rounds_epsilon, "number"),
    Figure("privacy_delta", "privacy", "the delta of (epsilon, delta)",
           lambda r: _delta(r) if "epsilon" in r.metrics else math.nan, "number"),
    Figure("dp_clipped_fraction", "privacy", "share of the clients' updates the DP mechanism clipped, mean over "
           "the rounds", lambda r: finite_mean(series(r, "dp_clipped_fraction")), "share"),
    Figure("secagg_clipped_fraction", "secure aggregation", "share of the clients' updates clipped to "
           "secagg.clip before masking, mean over the rounds",
           lambda r: finite_mean(series(r, "secagg_clipped_fraction")), "share"),
    Figure("secagg_rounds_half_clipped", "secure aggregation", "rounds in which more than half of the updates "
           "were clipped (each one warned about in the log and in run.h5)", _half_clipped_rounds, "count"),
    Figure("secagg_zeroed_updates", "secure aggregation", "updates that were not finite (NaN or infinite) and "
           "were masked as zeros instead, summed over the rounds (/metrics/secagg_zeroed_updates)",
           lambda r: _secagg_sum(r, "secagg_zeroed_updates"), "count"),
    Figure("secagg_extra_up_bytes", "secure aggregation", "protocol bytes a client sends beyond its masked "
           "update (keys, shares), mean over the cohort, summed over the rounds",
           lambda r: _secagg_sum(r, "secagg_extra_up_bytes"), "bytes"),
    Figure("secagg_extra_down_bytes", "secure aggregation", "protocol bytes a client receives (its neighbours' "
           "keys and shares), mean over the cohort, summed over the rounds",
           lambda r: _secagg_sum(r, "secagg_extra_down_bytes"), "bytes"),
    Figure("secagg_s", "secure aggregation", "seconds of masking (per client, summed) and unmasking (server) over "
           "the run", _secagg_time, "seconds"),
    Figure("sim_time_s", "deployment", "simulated seconds at the end of the last round (deployment realism's "
           "clock)", lambda r: last(series(r, "sim_time_s")), "seconds"),
    Figure("dropouts", "deployment", "selected clients that dropped out before uploading, summed over the "
           "rounds", _dropouts, "count"),
)
BY_NAME = {f.name: f for f in FIGURES}
# Figures whose infinite value is an answer (no epsilon bounds the model), not a failed measurement: summaries
# keep it (a group's mean is then infinite) where they leave out an infinite loss.
UNBOUNDED = ("epsilon", "noised_rounds_epsilon")
# A target accuracy (`--target ACC`) adds these two.
TARGET_FIGURES = (
    Figure("target_round", "accuracy", "first round (1-based) whose test accuracy reaches the target", None, "round"),
    Figure("target_bytes", "cost", "bytes moved up to and including that round", None, "bytes"),
)
DEFINITIONS = {f.name: f.definition for f in FIGURES + TARGET_FIGURES}
# Figures whose best value is the smallest (the others' is the largest): what a "best" cell or pick takes.
LOWER_IS_BETTER = frozenset({"final_loss", "final_perplexity", "best_perplexity", "local_perplexity_mean",
                             "local_acc_std", "rise_round", "target_round", "target_bytes", "uploads", "bytes_moved",
                             "wall_s", "emd", "backdoor_acc", "backdoor_acc_tail10", "epsilon",
                             "noised_rounds_epsilon", "privacy_delta", "dp_clipped_fraction",
                             "secagg_clipped_fraction", "secagg_rounds_half_clipped", "secagg_zeroed_updates",
                             "secagg_extra_up_bytes", "secagg_extra_down_bytes", "secagg_s", "sim_time_s", "dropouts",
                             "local_below_global_n"})

UNITS = {f.name: f.unit for f in FIGURES + TARGET_FIGURES}


def better(name):
    """The better end of figure `name`: "min" where its best value is its smallest (LOWER_IS_BETTER), else
    "max"."""
    return "min" if name in LOWER_IS_BETTER else "max"


def family_of(name):
    figure = BY_NAME.get(name) or next((f for f in TARGET_FIGURES if f.name == name), None)
    return figure.family if figure else None


def compute(run, target=None) -> dict:
    """{figure: value} of one run: every figure of FIGURES (NaN where the run has nothing to compute it from),
    and with `target` the two of TARGET_FIGURES."""
    values = {f.name: f.compute(run) for f in FIGURES}
    if target is not None:
        values["target_round"], values["target_bytes"] = target_figures(run, target)
    return values


def help_text(target=True):
    """One line per figure, `name: definition`, grouped by family (for `fedmpi report --help`)."""
    lines = []
    for family in FAMILIES:
        members = [f for f in FIGURES + (TARGET_FIGURES if target else ()) if f.family == family]
        lines += [f" {family}:"] + [f"  {f.name}: {f.definition}" for f in members]
    return "\n".join(lines)
