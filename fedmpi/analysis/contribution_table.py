"""The table and the figure of client contributions, for the values of any contribution method.

    t = contribution_table(values, traits)           # clients ordered by value, their traits beside
    print(t.markdown()); print(t.latex()); t.csv("contributions.csv")
    plot_contributions(values, traits, "contributions.png", color_by="label_skew")

`values` is a frame with a row per (client, method): `client`, `value` (positive: the client helps), and where
known `method` ("leave-one-out", "Shapley (exact)", "TMC-Shapley", ...; "leave-one-out" where absent),
`value_std` and `n` (over seeds), `metric` and `round`; fedmpi.analysis.contribution_report.leave_one_out_frame
gives such a frame, and several methods' frames concatenated are shown side by side. `traits` is
client_traits' frame (client, samples, label_skew, malicious). `fedmpi report` prints the table (and, with
--plot, draws the figure) for every leave-one-out study among its runs (`contribution_section`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedmpi.analysis import figures as figs
from fedmpi.analysis import selection
from fedmpi.analysis.contribution_report import METHOD, client_traits, leave_one_out_frame, lower_is_better
from fedmpi.analysis.paper_table import METRIC_TITLES, Cell, PaperTable
from fedmpi.core.errors import InputError

# Per-round /metrics names as a person reads them (summary figures: paper_table.METRIC_TITLES).
ROUND_METRIC_TITLES = {"test_acc": "test accuracy", "test_loss": "test loss", "train_loss": "training loss",
                       "test_perplexity": "test perplexity", "backdoor_acc": "backdoor success",
                       "local_acc_mean": "mean local accuracy"}
TRAITS = {"samples": "Samples", "label_skew": "Label skew (TV)", "malicious": "Malicious"}
COLOR_BY = ("malicious", "label_skew")
REPORT_ALL = 30         # `fedmpi report` shows every client up to this many, else the ends
REPORT_ENDS = 10


def is_share(metric):
    """An accuracy-like metric (a share of 1): its differences are shown in percentage points."""
    return figs.UNITS.get(metric) == "share" or metric.endswith("_acc") or metric == "test_acc"


def metric_words(metric, round_=None):
    """"test accuracy at round 10" (the metric's readable name and the round compared)."""
    title = ROUND_METRIC_TITLES.get(metric) or METRIC_TITLES.get(metric, metric)
    title = title[:1].lower() + title[1:] if title[1:2].islower() else title
    return f"{title} at round {round_}" if round_ is not None else title


def value_words(metric, round_=None, unit="pp"):
    """What a leave-one-out value is, as an axis label: "test accuracy at round 10 (pp): original - without
    the client" (a lower-is-better metric the other way round, so that positive still means "helps"); `unit`
    names the percentage points of an accuracy ("percentage points" in a caption)."""
    unit = f" ({unit})" if is_share(metric) else ""
    order = "without the client - original" if lower_is_better(metric) else "original - without the client"
    return f"{metric_words(metric, round_)}{unit}: {order}"


@dataclass
class ContributionTable(PaperTable):
    """A PaperTable of clients (rows, ordered by value) x methods, then the clients' traits; `.markdown()`,
    `.latex()` and `.csv(path)` as a paper table's, `.frame()` the values shown (one row per client and
    method, in the table's order)."""

    values: object = None
    shown: list = field(default_factory=list)

    def frame(self):
        order = {client: i for i, client in enumerate(self.shown)}
        rows = self.values[self.values["client"].isin(order)].copy()
        rows["_order"] = rows["client"].map(order)
        return rows.sort_values(["_order", "method"], kind="stable").drop(columns="_order").reset_index(drop=True)


def _prepared(values):
    if values is None or not len(values):
        raise InputError("contribution_table: no contribution values (no study had a finished original and "
                         "counterfactual; leave_one_out_frame(...).attrs['notes'] says what was left out)")
    missing = [c for c in ("client", "value") if c not in values.columns]
    if missing:
        raise InputError(f"contribution values: no column {', '.join(missing)} (need client and value; method, "
                         f"value_std, n, metric and round where known)")
    values = values.copy()
    if "method" not in values.columns:
        values["method"] = METHOD
    if "study" in values.columns and values["study"].nunique() > 1:
        raise InputError(f"contribution values of {values['study'].nunique()} studies "
                         f"({', '.join(map(str, values['study'].unique()))}): give one, e.g. "
                         f"values[values.study == {values['study'].iloc[0]!r}]")
    if "metric" in values.columns and values["metric"].nunique() > 1:
        raise InputError(f"contribution values of several metrics ({', '.join(map(str, values['metric'].unique()))}): "
                         f"give the values of one")
    duplicated = values.duplicated(["client", "method"])
    if duplicated.any():
        row = values[duplicated].iloc[0]
        raise InputError(f"contribution values: client {row['client']} has several {row['method']} values (one "
                         f"row per client and method)")
    return values


def _ordered_clients(values, order_by):
    """Clients by `order_by`'s value, highest first (clients it has no value for after, by id)."""
    methods = list(dict.fromkeys(values["method"]))
    order_by = methods[0] if order_by is None else order_by
    if order_by not in methods:
        raise InputError(f"order_by = {order_by!r}: not a method of these values ({', '.join(methods)})")
    ranked = values[values["method"] == order_by].sort_values(["value", "client"], ascending=[False, True])
    clients = list(ranked["client"])
    return clients + sorted(set(values["client"]) - set(clients)), methods


def contribution_table(values, traits=None, order_by=None, ends=None, digits=None) -> ContributionTable:
    """The clients as rows, ordered by the value of `order_by` (default: the first method), one column per
    method ("value ± std over the seeds" where a std is given, accuracies in percentage points), then the
    traits given (samples, label skew, malicious). `ends`: show only that many clients at each end (the most
    and the least helpful), the others named in a note. The caption says what the values are, at which round
    and over how many seeds; a cell whose n differs from the caption's is marked."""
    values = _prepared(values)
    clients, methods = _ordered_clients(values, order_by)
    hidden = []
    if ends is not None and len(clients) > 2 * ends:
        hidden, clients = clients[ends:-ends], clients[:ends] + clients[-ends:]
    metric = str(values["metric"].iloc[0]) if "metric" in values.columns else None
    scale = 100.0 if metric and is_share(metric) else 1.0
    digits = (2 if scale != 1.0 else 4) if digits is None else digits
    cells, ns = {}, []
    for _, row in values.iterrows():
        std = float(row.get("value_std", math.nan))
        n = int(row["n"]) if "n" in values.columns and np.isfinite(row["n"]) else 1
        text = f"{row['value'] * scale:+.{digits}f}" + (f" ± {std * scale:.{digits}f}" if np.isfinite(std) else "")
        cells[((row["client"],), (row["method"],))] = Cell(float(row["value"]), std, n, text)
        if row["client"] in clients:
            ns.append(n)
    trait_names = [t for t in TRAITS if traits is not None and t in traits.columns]
    by_client = traits.set_index("client") if trait_names else None
    for client in clients:
        for name in trait_names:
            if by_client is not None and client in by_client.index:
                value = float(by_client.at[client, name])
                cells[((client,), ("trait", name))] = Cell(value, math.nan, 1, _trait_text(name, value))
    n_common = max(set(ns), key=ns.count) if ns else 1
    notes = []
    for client in clients:
        marked = [m for m in methods if (c := cells.get(((client,), (m,)))) and c.n != n_common]
        if marked:
            mark = chr(ord("a") + len(notes)) if len(notes) < 26 else "*"
            for m in marked:
                cells[((client,), (m,))].mark = mark
            n = cells[((client,), (marked[0],))].n
            notes.append(f"{mark}: client {client}: over n={n} seed{'s' if n != 1 else ''} only")
    if hidden:
        ranks = f"{ends + 1}" if len(hidden) == 1 else f"{ends + 1} to {ends + len(hidden)}"
        notes.append(f"clients ranked {ranks} of {len(hidden) + 2 * ends} by value not shown")
    rows = [(c,) for c in clients]
    cols = [(m,) for m in methods] + [("trait", t) for t in trait_names]
    caption = _caption(values, metric, n_common)
    rounds = _rounds(values)
    # where the methods were compared at different rounds, each column says its own (the caption then none)
    method_labels = [f"{m} (round {', '.join(map(str, rounds[m]))})" for m in methods] \
        if len({tuple(r) for r in rounds.values()}) > 1 else methods
    return ContributionTable(rows, cols, ["client"], ["method"], [str(c) for c in clients],
                             method_labels + [TRAITS[t] for t in trait_names], "Client", cells, caption, notes, "std",
                             metric or "value", values=values, shown=clients)


def _trait_text(name, value):
    if not np.isfinite(value):
        return "–"
    if name == "malicious":
        return "yes" if value == 1 else "no" if value == 0 else f"in {value:.0%} of seeds"
    return f"{value:.0f}" if name == "samples" else f"{value:.2f}"


def _rounds(values):
    """{method: the rounds its values were taken at} ([] where the values do not say)."""
    if "round" not in values.columns:
        return {m: [] for m in values["method"]}
    return {m: sorted({int(r) for r in rows["round"]}) for m, rows in values.groupby("method", sort=False)}


def _caption(values, metric, n_common):
    rounds = sorted({r for found in _rounds(values).values() for r in found})
    at = rounds[0] if len(rounds) == 1 else None
    what = value_words(metric, at, "percentage points") if metric else "contribution"
    spread = f"; value ± std over n={n_common} seeds" if n_common > 1 else f"; n={n_common} seed"
    return f"Client contributions, {what}; positive: the client helps{spread}."


# --- the figure -----------------------------------------------------------------------------------------

def plot_contributions(values, traits, path, color_by="malicious", width=None):
    """Horizontal bars of the clients' values, one panel per method, the most helpful client on top, coloured
    by a trait (`color_by`: malicious or label_skew; a client without it grey), with error bars of ± 1 std
    over the seeds where given; the axis says what the value is. Written at `path` (its suffix picks the
    format); returns the matplotlib Figure (closed, its Axes still readable)."""
    from fedmpi.analysis.figure_style import check_width, style
    from fedmpi.analysis.plotting import pyplot, save_figure, wrap

    if color_by not in COLOR_BY:
        raise InputError(f"color_by = {color_by!r}: must be {' or '.join(COLOR_BY)}")
    check_width(width)
    values = _prepared(values)
    methods = list(dict.fromkeys(values["method"]))
    trait = (traits.set_index("client")[color_by] if traits is not None and color_by in traits.columns
             else None)
    metric = str(values["metric"].iloc[0]) if "metric" in values.columns else None
    scale = 100.0 if metric and is_share(metric) else 1.0
    plt = pyplot()
    clients = values["client"].nunique()
    panel_w = (width / len(methods)) if width else 4.8
    with style(width):
        # constrained layout: it makes room for the label-skew colour bar, which tight_layout cannot
        fig, axes = plt.subplots(1, len(methods), squeeze=False, layout="constrained",
                                 figsize=(panel_w * len(methods), 1.2 + 0.22 * clients))
        for ax, method in zip(axes[0], methods):
            rows = values[values["method"] == method].sort_values(["value", "client"], ascending=[False, True])
            _bars(ax, rows, trait, color_by, scale)
            rounds = sorted({int(r) for r in rows["round"]}) if "round" in rows.columns else [None]
            ax.set_xlabel(wrap(value_words(metric, rounds[0]) if metric else "contribution", 44))
            ax.set_title(method)
        axes[0][0].set_ylabel("client")
        _legend(fig, axes[0], trait, color_by, values)
        save_figure(fig, path)
        plt.close(fig)
    return fig


def _colours(rows, trait, color_by):
    import matplotlib

    known = [trait.get(c, math.nan) if trait is not None else math.nan for c in rows["client"]]
    if color_by == "label_skew":
        cmap = matplotlib.colormaps["viridis"]
        return [cmap(v) if np.isfinite(v) else "0.7" for v in known]
    return ["0.7" if not np.isfinite(v) else "C3" if v == 1 else "C0" if v == 0 else "C1" for v in known]


def _bars(ax, rows, trait, color_by, scale):
    """The bars of one method, the first row (the highest value) at the top."""
    y = np.arange(len(rows))[::-1]
    x = rows["value"].to_numpy(dtype=np.float64) * scale
    ax.barh(y, x, color=_colours(rows, trait, color_by), height=0.7)
    if "value_std" in rows.columns:
        std = rows["value_std"].to_numpy(dtype=np.float64) * scale
        has = np.isfinite(std)
        if has.any():
            ax.errorbar(x[has], y[has], xerr=std[has], fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.set_yticks(y, [str(c) for c in rows["client"]])
    ax.set_ylim(-0.6, len(rows) - 0.4)


def _legend(fig, axes, trait, color_by, values):
    from matplotlib.patches import Patch

    seeds = int(values["n"].max()) if "n" in values.columns and len(values) else 1
    bars = f"error bars: ± 1 std over up to {seeds} seeds" if values.get("value_std") is not None and \
        np.isfinite(values["value_std"].to_numpy(dtype=np.float64)).any() else "one seed: no error bars"
    if color_by == "label_skew":
        import matplotlib

        mappable = matplotlib.cm.ScalarMappable(cmap="viridis", norm=matplotlib.colors.Normalize(0, 1))
        fig.colorbar(mappable, ax=list(axes), label="label skew (TV distance to the pooled labels)",
                     fraction=0.05)
        fig.text(0.5, 0.0, bars, ha="center", va="top")
        return
    present = set(trait.dropna().unique()) if trait is not None else set()
    kinds = [("C0", "honest", 0 in present), ("C3", "malicious", 1 in present),
             ("C1", "malicious in some seeds", bool(present - {0, 1})),
             ("0.7", "not known", trait is None or trait.isna().any())]
    handles = [Patch(color=colour, label=label) for colour, label, shown in kinds if shown]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles), frameon=False,
               title=bars)


# --- in `fedmpi report` ---------------------------------------------------------------------------------

def contribution_studies(runs, include=None, at_round=None):
    """(study, its values, its traits) of every leave-one-out study among `runs`, and the frame's notes."""
    values = leave_one_out_frame(runs, include=include, at_round=at_round)
    studies = []
    loaded = {run.path: run for run in runs}        # the originals as read already, not read again
    for study, rows in values.groupby("study", sort=False):
        rows = rows.reset_index(drop=True)
        originals = [loaded.get(path, path) for path in rows["original_paths"].iloc[0]]
        studies.append((study, rows, client_traits(originals)))
    return studies, list(values.attrs.get("notes", ()))


def has_counterfactuals(runs):
    """Whether some run declares a change from an original (a `counterfactual:` section with drop or remove)."""
    return any(isinstance(c := run.config.get("counterfactual"), dict) and (c.get("drop") or c.get("remove"))
               for run in runs)


def contribution_section(runs, fmt="text", include=None, at_round=None):
    """`fedmpi report`'s "Client contributions (leave-one-out)" section (Markdown tables, or LaTeX with
    fmt="latex"), or None where no run is a counterfactual."""
    if not has_counterfactuals(runs):
        return None
    comment = "% " if fmt == "latex" else ""
    lines = [f"{comment}Client contributions (leave-one-out):"]
    try:
        studies, notes = contribution_studies(runs, include, at_round)
    except (InputError, selection.SelectionError) as e:
        return "\n".join(lines + [f"{comment}not computed: {e}"])
    for study, values, traits in studies:
        ends = None if values["client"].nunique() <= REPORT_ALL else REPORT_ENDS
        table = contribution_table(values, traits, ends=ends)
        lines += ["", f"{comment}study {study} (originals: {values['original'].iloc[0]})",
                  table.latex() if fmt == "latex" else table.markdown()]
    if not studies:
        lines.append(f"{comment}no study has a finished original with a finished single-client drop")
    lines += [f"{comment}note: {note}" for note in notes]
    return "\n".join(lines)


def contribution_figure_tags(runs):
    """The tag of each study's figure beside --plot (PLOT-TAG.png): `contributions`, or
    `contributions-STUDY` where there are several studies; [] without counterfactuals."""
    if not has_counterfactuals(runs):
        return []
    try:
        studies, _ = contribution_studies(runs, include="all")
    except (InputError, selection.SelectionError):
        return []
    names = [study for study, _, _ in studies]
    return [("contributions", names[0])] if len(names) == 1 else [(f"contributions-{n}", n) for n in names]


def plot_study(runs, study, path, include=None, at_round=None):
    """`fedmpi report --plot`'s figure of one study (coloured by malicious where the study has an attack, else
    by label skew); False where it has no values (its runs left out), so that nothing is drawn."""
    try:
        studies, _ = contribution_studies(runs, include, at_round)
    except (InputError, selection.SelectionError):
        return False
    for name, values, traits in studies:
        if name == study:
            attacked = traits["malicious"].fillna(0).gt(0).any()
            plot_contributions(values, traits, path, color_by="malicious" if attacked else "label_skew")
            return True
    return False
