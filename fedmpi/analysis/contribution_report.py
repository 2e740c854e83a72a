"""Leave-one-out contributions of clients, from an original run and its single-client drop counterfactuals.

    values = leave_one_out_frame("runs/study")        # one row per (study, client): value = metric(original)
    traits = client_traits(values["original_paths"][0])   #   - metric(without the client), sign as below
    print(contribution_table(values, traits).markdown())  # fedmpi.analysis.contribution_table

A counterfactual run declares its original (config `counterfactual.of`, run.h5's `counterfactual_of`) and the
one way it differs from it; a leave-one-out study is the original plus one run per client k with
`counterfactual.drop: [k]`. The value of client k is metric(original) - metric(drop k) where a higher metric is
better (accuracy), and metric(drop k) - metric(original) where a lower one is (a loss, a perplexity): a positive
value always means that the client helps.

As every grouped result of fedmpi.analysis (fedmpi.analysis.selection): only finished runs are used unless
`include` names others, and each run left out is named in the frame's notes (`attrs["notes"]`, and the `note`
of the rows it concerns); every value of a study is taken at one round, the last round at which the original
and every counterfactual used measured the metric (or `at_round`). Originals with the same config but their
seed are one study: each client's value is the mean over the seeds that have its counterfactual, with the
sample std beside it.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np

from fedmpi.analysis import figures as figs
from fedmpi.analysis import frames, selection
from fedmpi.core.errors import FedmpiError, InputError

METHOD = "leave-one-out"
COLUMNS = ["study", "original", "seeds", "client", "method", "metric", "round", "value", "value_std", "n",
           "original_value", "counterfactual_value", "counterfactuals", "original_paths", "note"]
# Config keys that may differ between a counterfactual and its original: how it ran, where it wrote, the change.
NOT_THE_RUN = frames.RUN_ONLY_KEYS + ("counterfactual.",)


def lower_is_better(metric):
    """Whether a smaller `metric` is better: a figure of fedmpi.analysis.figures.LOWER_IS_BETTER, or a
    per-round loss or perplexity (test_loss, train_loss, test_perplexity)."""
    return metric in figs.LOWER_IS_BETTER or metric.endswith("_loss") or "perplexity" in metric


def leave_one_out_frame(df_or_paths, metric="test_acc", at_round=None, include=None, err=None):
    """One row per (study, client) of the leave-one-out studies among the runs in `df_or_paths` (a `runs()`
    DataFrame, paths or globs, or Run objects).

    `metric` is a per-round /metrics name (test_acc, test_loss, test_perplexity, ...) read at the round
    compared, or a summary figure of fedmpi.analysis.figures computed from the runs' first R rounds.
    Columns: `study` (the name of the study's first original), `original` (the originals used, by name),
    `seeds`, `client`, `method` ("leave-one-out"), `metric`, `round` (1-based), `value` (mean over the seeds,
    positive: the client helps), `value_std` (sample std over the seeds; NaN for one), `n` (seeds used),
    `original_value` and `counterfactual_value` (means over those seeds), `counterfactuals` (their names),
    `original_paths` (the originals' run files, for client_traits) and `note` (what this row left out).
    `attrs["notes"]` lists every run left out and why; `attrs["left_out"]` their names."""
    runs = frames._as_runs(df_or_paths, err)
    names = dict(zip(map(id, runs), frames.unique_names(runs)))
    notes, left_names = [], []

    def leave(run, why):
        notes.append(f"{names[id(run)]}: {why}")
        left_names.append(names[id(run)])

    originals = [run for run in runs if _change(run) is None]
    pairs = _match(runs, originals, leave)       # {id(original): {client: counterfactual run}}
    keep = selection.included(include)
    rows = []
    for study_members in _studies(originals, pairs, names):
        study = names[id(study_members[0])]
        used = []
        for original in study_members:
            by_client = pairs.get(id(original), {})
            if not _kept(original, keep):
                leave(original, f"{_status_words(original)}: the original and its {len(by_client)} counterfactual(s) "
                                f"left out")
                continue
            kept = {}
            for client, cf in sorted(by_client.items()):
                if _kept(cf, keep):
                    kept[client] = cf
                else:
                    leave(cf, f"{_status_words(cf)}: client {client} of {names[id(original)]} left out")
            if kept:
                used.append((original, kept))
        if not used:
            continue
        round_ = _common_round([r for o, k in used for r in (o, *k.values())], metric, at_round, names)
        if round_ is None:
            notes.append(f"{study}: no round at which the original and every counterfactual measured {metric}: "
                         f"the study left out")
            continue
        rows += _rows(study, used, metric, round_, names, notes)
    pd = frames._pandas()
    out = pd.DataFrame(rows, columns=COLUMNS)
    out.attrs["notes"] = notes
    out.attrs["left_out"] = left_names
    out.attrs["metric"] = metric
    return out


# --- finding the studies --------------------------------------------------------------------------------

def _change(run):
    """(drop, remove) of a counterfactual run, None for a run that declares no change."""
    section = run.config.get("counterfactual")
    if not isinstance(section, dict):
        return None
    drop, remove = tuple(section.get("drop") or ()), tuple(section.get("remove") or ())
    return (drop, remove) if drop or remove else None


def _folder(path):
    return os.path.realpath(os.path.dirname(os.path.abspath(path)))


def _declared_folders(run):
    """Where the counterfactual's original may be: run.h5's `counterfactual_of`, then the config's `of` as given
    (absolute, or relative to the folder the run was started from, found by taking its `out` off its folder's
    end, or to the current folder)."""
    section = run.config.get("counterfactual") or {}
    found = [str(run.attrs["counterfactual_of"])] if run.attrs.get("counterfactual_of") else []
    of = section.get("of")
    if isinstance(of, str) and of:
        if os.path.isabs(of):
            found.append(of)
        else:
            folder, out = _folder(run.path), os.path.normpath(str(run.config.get("out") or ""))
            if out not in ("", ".") and not os.path.isabs(out) and folder.endswith(os.sep + out):
                found.append(os.path.join(folder[:-len(out)], of))
            found.append(os.path.abspath(of))
    return [os.path.realpath(p) for p in found]


def _declared_name(run):
    for value in (run.attrs.get("counterfactual_of"), (run.config.get("counterfactual") or {}).get("of")):
        if isinstance(value, str) and value:
            return os.path.basename(os.path.normpath(value))
    return None


def _match(runs, originals, leave):
    """{id(original): {client: its drop-[client] counterfactual}}. A counterfactual whose declared original is
    not among the runs is matched, failing that, to an original of the same folder name beside it (a study
    folder that was moved); one whose config differs from its original's in more than the counterfactual
    section, or that is not a single-client drop, is not used (and named)."""
    by_folder = {_folder(o.path): o for o in originals}
    pairs = {}
    for run in runs:
        change = _change(run)
        if change is None:
            continue
        drop, remove = change
        if len(drop) != 1 or remove:
            leave(run, f"not a single-client drop ({run.attrs.get('counterfactual_change') or change}): not a "
                       f"leave-one-out counterfactual")
            continue
        original = next((by_folder[f] for f in _declared_folders(run) if f in by_folder), None)
        if original is None:
            name = _declared_name(run)
            original = next((o for o in originals if name and os.path.basename(_folder(o.path)) == name
                             and os.path.dirname(_folder(o.path)) == os.path.dirname(_folder(run.path))), None)
        if original is None:
            leave(run, "its original (counterfactual.of) is not among the runs given")
            continue
        differ = _differing(original.config, run.config)
        if differ:
            leave(run, f"differs from its original in {', '.join(differ)}: not a leave-one-out of it")
            continue
        client = int(drop[0])
        found = pairs.setdefault(id(original), {})
        if client in found:
            leave(run, f"a second drop of client {client}: the first one found is used")
            continue
        found[client] = run
    return pairs


def _what_it_computes(config):
    return {k: repr(v) for k, v in frames.flatten(config).items() if not (k + ".").startswith(NOT_THE_RUN)}


def _differing(a, b):
    a, b = _what_it_computes(a), _what_it_computes(b)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _studies(originals, pairs, names):
    """The originals that have counterfactuals, grouped by config less the seed (seeds of one study), each
    group's runs in name order, the groups in the order of their first run's name."""
    groups = {}
    for original in sorted((o for o in originals if pairs.get(id(o))), key=lambda o: names[id(o)]):
        key = tuple(sorted((k, v) for k, v in _what_it_computes(original.config).items() if k != "seed"))
        groups.setdefault(key, []).append(original)
    return list(groups.values())


def _kept(run, keep):
    return selection.category(selection.run_status(run.attrs)) in keep


def _status_words(run):
    status = selection.category(selection.run_status(run.attrs))
    reached = len(run.metrics.get("round", ()))
    return f"running at round {reached}" if status == "running" else status


# --- the values -----------------------------------------------------------------------------------------

def _measured_rounds(run, metric):
    """The 1-based rounds at which `metric` was measured: a summary figure at every evaluated round (every
    round reached where the test accuracy was never evaluated)."""
    if metric in figs.BY_NAME:
        return set(selection.evaluated_rounds(run)) or set(range(1, len(run.metrics.get("round", ())) + 1))
    values = run.metrics.get(metric)
    if values is None or np.ndim(values) != 1:
        return set()
    rounds = np.asarray(run.metrics["round"], dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)[:len(rounds)]
    return {int(r) + 1 for r in rounds[:len(values)][np.isfinite(values)]}


def _common_round(runs, metric, at_round, names):
    """The round a study compares at: `at_round` (refused where a run did not measure the metric there), else
    the last round at which every run measured it (None where there is none)."""
    if metric not in figs.BY_NAME and not any(metric in run.metrics for run in runs):
        present = sorted({m for run in runs for m, v in run.metrics.items() if np.ndim(v) == 1} - {"round"})
        raise InputError(f"metric = {metric!r}: no run of the study recorded it (a /metrics name: "
                         f"{', '.join(present[:12])}; or a summary figure such as final_acc)")
    measured = [_measured_rounds(run, metric) for run in runs]
    if at_round is not None:
        selection.comparison_round([], [len(run.metrics.get("round", ())) for run in runs],
                                   [names[id(run)] for run in runs], at_round)     # checks the number and reach
        missing = [names[id(run)] for run, rounds in zip(runs, measured) if at_round not in rounds]
        if missing:
            raise selection.SelectionError(f"at_round = {at_round}: {missing[0]} did not measure {metric} at that "
                                           f"round (give a round every run of the study measured)")
        return int(at_round)
    common = set.intersection(*measured) if measured else set()
    return max(common) if common else None


def _value_at(run, metric, round_):
    if metric in figs.BY_NAME:
        return float(figs.compute(selection.at_round_of(run, round_))[metric])
    rounds = np.asarray(run.metrics["round"], dtype=np.float64)
    where = np.nonzero(rounds == round_ - 1)[0]
    return float(np.asarray(run.metrics[metric], dtype=np.float64)[where[0]]) if len(where) else math.nan


def _rows(study, used, metric, round_, names, notes):
    sign = -1.0 if lower_is_better(metric) else 1.0
    originals = [names[id(o)] for o, _ in used]
    base = {id(o): _value_at(o, metric, round_) for o, _ in used}
    clients = sorted({c for _, kept in used for c in kept})
    rows = []
    for client in clients:
        have = [(o, kept[client]) for o, kept in used if client in kept]
        ours = np.array([base[id(o)] for o, _ in have])
        theirs = np.array([_value_at(cf, metric, round_) for _, cf in have])
        diffs = sign * (ours - theirs)
        note = ""
        if len(have) < len(used):
            without = [names[id(o)] for o, kept in used if client not in kept]
            note = f"n={len(have)} of {len(used)} seeds: no counterfactual used for {', '.join(without)}"
        rows.append({"study": study, "original": ", ".join(originals),
                     "seeds": ",".join(str(o.config.get("seed")) for o, _ in have), "client": client,
                     "method": METHOD, "metric": metric, "round": round_, "value": float(diffs.mean()),
                     "value_std": float(diffs.std(ddof=1)) if len(diffs) > 1 else math.nan, "n": len(have),
                     "original_value": float(ours.mean()), "counterfactual_value": float(theirs.mean()),
                     "counterfactuals": ", ".join(names[id(cf)] for _, cf in have),
                     "original_paths": tuple(o.path for o, _ in used), "note": note})
        if note:
            notes.append(f"{study}: client {client}: {note}")
    return rows


# --- what describes a client ----------------------------------------------------------------------------

def client_traits(run_path):
    """One row per client of the run(s) at `run_path` (a run.h5 or run folder, a Run, or a list of them: the
    seeds of one study): `client`, `samples` (its training samples), `label_skew` (total variation distance between its
    label distribution and the pooled one of all clients, 0 to 1), `malicious` (the share of the runs whose
    attack made it malicious: 0 or 1 for one run) and `runs`. Numbers are means over the runs that recorded
    them. Read from run.h5's /partition (the clients after data sharing, /partition/shared, where the run
    shared data) and /attack/malicious (fedmpi.attacks.malicious_clients of the config where it is absent)."""
    paths = [run_path] if isinstance(run_path, (str, os.PathLike)) or hasattr(run_path, "metrics") else run_path
    runs = [item for item in paths if hasattr(item, "metrics")]      # Run objects as they are, paths read
    named = [item for item in paths if not hasattr(item, "metrics")]
    runs += frames._as_runs(named) if named else []
    if not runs:
        raise InputError(f"client_traits: no run file at {run_path!r}")
    per_run = [_traits_of(run) for run in runs]
    clients = max(len(t["samples"]) for t in per_run)
    pd = frames._pandas()
    table = {"client": np.arange(clients)}
    for name in ("samples", "label_skew", "malicious"):
        stacked = np.full((len(per_run), clients), np.nan)
        for i, t in enumerate(per_run):
            stacked[i, :len(t[name])] = t[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # a client no run recorded: NaN, as meant
            table[name] = np.nanmean(stacked, axis=0)
    table["runs"] = len(per_run)
    return pd.DataFrame(table)


def _traits_of(run):
    partition = run.groups.get("partition/shared") or run.partition
    labels = np.asarray(partition.get("labels", np.zeros((0, 0))), dtype=np.float64)
    samples = np.asarray(partition.get("samples", labels.sum(axis=1) if labels.ndim == 2 else ()), dtype=np.float64)
    clients = len(samples) or int((run.config.get("partition") or {}).get("clients") or 0)
    if labels.ndim == 2 and len(labels) and labels.sum() > 0:
        pooled = labels.sum(axis=0) / labels.sum()
        totals = labels.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            skew = 0.5 * np.abs(labels / totals - pooled).sum(axis=1)
        skew[totals[:, 0] == 0] = math.nan
    else:
        skew = np.full(clients, math.nan)
    if not len(samples):
        samples = np.full(clients, math.nan)
    malicious = np.zeros(clients)
    ids = _malicious_ids(run, clients)
    if ids is None:
        malicious[:] = math.nan
    else:
        malicious[[i for i in ids if 0 <= i < clients]] = 1.0
    return {"samples": samples, "label_skew": skew, "malicious": malicious}


def _malicious_ids(run, clients):
    """The run's malicious client ids: /attack/malicious, else the attack's set drawn again from the config
    (None where it cannot be known)."""
    recorded = run.groups.get("attack", {}).get("malicious")
    if recorded is not None:
        return [int(i) for i in np.asarray(recorded).ravel()]
    attack = run.config.get("attack")
    if not isinstance(attack, dict) or attack.get("name", "none") == "none":
        return []
    try:
        from fedmpi.attacks import malicious_clients
        from fedmpi.config import from_dict

        return [int(i) for i in malicious_clients(from_dict(run.config).attack, clients, run.config.get("seed", 0))]
    except (FedmpiError, ImportError, TypeError, ValueError):      # a config this version cannot rebuild: unknown
        return None
