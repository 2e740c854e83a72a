"""The drawn figures read back from their matplotlib artists (Agg): a 5 methods x 2 betas x 3 seeds grid, the
families overview and a privacy run's figure, on run files written in the run log's layout (tests/run_files.py)
with seeded curves.

Findings: F01 ten groups in unrelated colours (method and setting not told apart); F02 the band is +- 1 std and the
figure does not say so; F03 the bytes axis' tick labels run together ("20.0 MB40.0 MB..."); F04 the privacy panel
puts an epsilon of 8 on an axis with no tick, labelled as if it were infinite and drawn at 1000; F05 a figure
only legible at screen size; F06 an axis range set by a non-finite value."""

from __future__ import annotations

import itertools
import os

import h5py
import matplotlib
import matplotlib.image
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from run_files import base_config, write_run
from test_analysis_api import with_local_eval

import fedmpi.analysis as a
from fedmpi.analysis import curves, figure_style, overview
from fedmpi.core.errors import InputError

METHODS = ("fedavg", "fedprox", "scaffold", "fednova", "fedskip")
BETAS = (0.1, 0.5)
SEEDS = (0, 1, 2)
ROUNDS = 10
FIGURES_SEEN = os.environ.get("FEDMPI_FIGURE_DIR")      # set to keep the drawn PNGs for a look by eye


def grid_run(root, method, beta, seed, *, bytes_per_round=1e7, attrs=None, extra=None):
    """A run whose accuracy rises towards a method's and beta's plateau, with seeded noise per seed."""
    folder = root / f"{method}-b{beta}-s{seed}"
    config = base_config(folder, seed=seed, rounds=ROUNDS, algorithm={"name": method},
                         partition={"clients": 5, "scheme": "dirichlet", "beta": beta}, **(extra or {}))
    path = write_run(folder / "run.h5", rounds=ROUNDS, config=config, attrs=attrs)
    g = np.random.default_rng([METHODS.index(method), int(beta * 10), seed, sum(map(ord, str(extra or "")))])
    top = 0.6 + 0.05 * METHODS.index(method) + 0.3 * beta - 0.1 * bool(extra)
    acc = top * (1 - np.exp(-np.arange(1, ROUNDS + 1) / 3)) + g.normal(0, 0.02, ROUNDS)
    with h5py.File(path, "a") as f:
        m = f["metrics"]
        m["test_acc"][...] = acc
        m["test_loss"][...] = 2.3 * np.exp(-np.arange(ROUNDS) / 4) + g.uniform(0, 0.1, ROUNDS)
        m["bytes_up"][...] = np.full(ROUNDS, bytes_per_round / 2)
        m["bytes_down"][...] = np.full(ROUNDS, bytes_per_round / 2)
    return path


def grid(root):
    for method, beta, seed in itertools.product(METHODS, BETAS, SEEDS):
        grid_run(root, method, beta, seed)
    return a.load_runs([str(root)])


def drawn(monkeypatch, module, draw, name):
    """The figure `draw` saves (it closes it after): kept from the module's save_figure, drawn once with Agg."""
    kept = []
    real = module.save_figure

    def keep(fig, path):
        real(fig, path)
        kept.append(fig)
    monkeypatch.setattr(module, "save_figure", keep)
    draw()
    [fig] = kept
    FigureCanvasAgg(fig).draw()         # pyplot closed it: a canvas of its own to render it with
    if FIGURES_SEEN:
        os.makedirs(FIGURES_SEEN, exist_ok=True)
        real(fig, os.path.join(FIGURES_SEEN, name))
    return fig


def tick_labels(axis):
    """The drawn tick labels of one matplotlib Axis: those inside the view with text."""
    low, high = sorted(axis.get_view_interval())
    return [label for tick, label in zip(axis.get_majorticklocs(), axis.get_ticklabels())
            if low - 1e-9 * abs(high - low) <= tick <= high + 1e-9 * abs(high - low) and label.get_text()]


def check_artists(fig):
    """What every figure must hold: tick labels that do not overlap, every line's label in the legend, finite
    axis limits; returns the legend texts."""
    renderer = fig.canvas.get_renderer()
    legend_texts = {t.get_text() for legend in fig.legends for t in legend.get_texts()}
    legend_texts |= {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        assert np.isfinite(ax.get_xlim()).all() and np.isfinite(ax.get_ylim()).all(), ax.get_title()
        for axis in (ax.xaxis, ax.yaxis):
            boxes = [label.get_window_extent(renderer) for label in tick_labels(axis)]
            for one, other in itertools.combinations(boxes, 2):
                assert not one.overlaps(other), (ax.get_title(), [t.get_text() for t in tick_labels(axis)])
        for drawn_thing in [*ax.get_lines(), *ax.containers]:         # lines, and points with error bars
            label = drawn_thing.get_label()
            if not label.startswith("_"):       # the line's label, or (at a paper's width) its method and setting
                assert label in legend_texts or set(figure_style.label_parts(label)) - {""} <= legend_texts, label
    return legend_texts


def legend_titles(fig):
    return " ".join(legend.get_title().get_text() for legend in fig.legends)


def test_a_methods_by_betas_grid_is_coloured_by_method_styled_by_beta_and_names_its_band(tmp_path, monkeypatch):
    """F01, F02, F03: 10 groups of 3 seeds, against rounds and bytes moved."""
    runs = grid(tmp_path / "runs")
    for x in ("round", "bytes"):
        fig = drawn(monkeypatch, curves, lambda x=x: a.plot_sweep(runs, ["method", "partition.beta"],
                                                                 str(tmp_path / f"grid-{x}.png"), x=x,
                                                                 metrics=("test_acc", "test_loss")),
                    f"grid-{x}.png")
        check_artists(fig)
        lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
        assert len(lines) == len(METHODS) * len(BETAS)
        for method in METHODS:
            mine = [line for label, line in lines.items() if label.split(", ")[0].split("=")[-1] == method]
            assert len({line.get_color() for line in mine}) == 1, method           # one colour per method
            assert len({str(line.get_linestyle()) for line in mine}) == len(BETAS)  # one style per beta
        assert len({line.get_color() for line in lines.values()}) == len(METHODS)
        assert "95% CI" in legend_titles(fig)
    ticks = [t.get_text() for t in tick_labels(fig.axes[0].xaxis)]
    assert all(t.endswith("B") and " " in t for t in ticks if t not in ("0", "0 B")), ticks       # "50 MB"
    assert len(ticks) <= 6
    std = drawn(monkeypatch, curves, lambda: a.plot_sweep(runs, ["method", "partition.beta"],
                                                          str(tmp_path / "std.png"), band="std"), "grid-std.png")
    assert "1 std" in legend_titles(std)


def test_the_bytes_axis_of_each_run_has_si_ticks_that_do_not_touch(tmp_path, monkeypatch):
    """F03: one line per run against bytes moved, at the default size and at a column's width."""
    runs = [a.report.read_run(str(grid_run(tmp_path / "runs", "fedavg", 0.5, seed, bytes_per_round=2.2e7)))
            for seed in SEEDS]
    fig = drawn(monkeypatch, curves, lambda: a.plot_curves(runs, str(tmp_path / "bytes.png"), x="bytes"),
                "runs-bytes.png")
    check_artists(fig)
    ticks = [t.get_text() for t in tick_labels(fig.axes[0].xaxis)]
    assert ticks and all(t.endswith("MB") for t in ticks), ticks


def test_the_band_is_the_t_interval_of_the_tables_and_a_single_run_has_none():
    ys = np.array([[0.5, 0.6], [0.6, 0.8], [0.8, 0.7]])
    half = figure_style.band_half_width(ys, "ci95")
    np.testing.assert_allclose(half, 4.302653 * ys.std(axis=0, ddof=1) / np.sqrt(3), rtol=1e-4)
    assert figure_style.band_half_width(ys[:1], "ci95") is None
    assert figure_style.band_note("ci95", {"g": [1]}).endswith("no band (one run per group)")
    with pytest.raises(InputError, match="band: 'var' is not one of ci95, std, sem, none"):
        figure_style.check_band("var")


def families(root):
    """personalization (local evaluation), robustness (backdoor_acc), privacy (epsilon 8 and an unbounded
    twin), deployment (sim_time_s): two methods x 2 seeds each, one seed's loss diverging to infinity."""
    for seed in (0, 1):
        for method in ("fedavg", "fedprox"):
            shift = 0.1 * (method == "fedprox")
            path = with_local_eval(grid_run(root, method, 0.5, seed), ROUNDS, (0.5 + shift, 0.7, 0.9, 0.2 + shift))
            with h5py.File(path, "a") as f:
                f["metrics"]["backdoor_acc"] = np.linspace(0.1, 0.4 + 0.1 * seed, ROUNDS)
                if method == "fedprox" and seed == 1:
                    f["metrics"]["test_loss"][5:] = [np.inf, np.nan, -np.inf, np.inf, np.nan]
        privacy_run(root, seed)
        privacy_run(root, seed, epsilon=np.inf, clip=True)
    return a.load_runs([str(root)])


def privacy_run(root, seed, epsilon=8.0, clip=False):
    privacy = {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.0 if clip else 1.1}
    path = grid_run(root / ("clip" if clip else "dp"), "fedavg", 0.5, seed, attrs={"privacy_epsilon": epsilon,
                    "privacy_delta": 1e-5}, extra={"privacy": privacy})
    with h5py.File(path, "a") as f:
        f["metrics"]["epsilon"] = np.full(ROUNDS, np.inf) if clip else np.linspace(1.0, epsilon, ROUNDS)
    return path


def privacy_panel(fig):
    [ax] = [ax for ax in fig.axes if ax.get_title().startswith("privacy")]
    return ax


def test_the_families_overview_draws_epsilon_8_at_8_and_names_the_infinite_one(tmp_path, monkeypatch):
    """F04, F06: the privacy panel's point sits at the run's epsilon, on an axis with ticks around it; the
    unbounded twin is said in words; no axis is scaled by the infinite loss."""
    runs = families(tmp_path / "runs")
    fig = drawn(monkeypatch, overview, lambda: a.plot_overview(runs, str(tmp_path / "families.png")),
                "families.png")
    check_artists(fig)
    ax = privacy_panel(fig)
    [point] = [c.lines[0] for c in ax.containers if c.get_label().startswith("fedavg+dp")]
    assert point.get_xdata()[0] == pytest.approx(8.0)
    ticks = [float(t.get_text().replace("\u2212", "-")) for t in tick_labels(ax.xaxis)]
    assert len(ticks) >= 3 and min(ticks) < 8 <= max(ticks)
    assert "1000" not in ax.get_xlabel()
    assert "fedavg+clip1" in ax.get_xlabel() and "infinite" in ax.get_xlabel()
    [loss] = [ax for ax in fig.axes if ax.get_title().startswith("test loss")]
    assert loss.get_ylim()[1] < 10                     # the diverging seed's points are not drawn
    assert "95% CI" in legend_titles(fig)
    fedavg = {line.get_color() for ax in fig.axes for line in ax.get_lines() if line.get_label() == "fedavg (n=2)"}
    assert len(fedavg) == 1


def test_a_privacy_run_alone_has_its_epsilon_and_no_band(tmp_path, monkeypatch):
    """F04: one run of epsilon 8 (the trial's case): the point at 8 with ticks; a single run has no band."""
    runs = a.load_runs([str(privacy_run(tmp_path / "runs", 0))])
    fig = drawn(monkeypatch, overview, lambda: a.plot_overview(runs, str(tmp_path / "privacy.png")),
                "privacy.png")
    check_artists(fig)
    ax = privacy_panel(fig)
    [point] = [c.lines[0] for c in ax.containers]
    assert point.get_xdata()[0] == pytest.approx(8.0)
    assert len(tick_labels(ax.xaxis)) >= 3
    assert "no band" in legend_titles(fig)
    assert not any(ax.collections for ax in fig.axes if not ax.get_title().startswith("privacy"))


def test_no_privacy_panel_without_a_finite_epsilon(tmp_path):
    runs = a.load_runs([str(privacy_run(tmp_path / "runs", 0, epsilon=np.inf, clip=True))])
    assert overview._privacy not in overview.family_panels(runs)


@pytest.mark.parametrize("suffix", ["png", "pdf", "svg"])
def test_at_a_papers_column_width_the_text_is_7_pt_or_more_and_the_format_is_the_suffix(tmp_path, monkeypatch,
                                                                                          suffix):
    """F05: 3.5 in wide, every text at least 7 pt, nothing overlapping; PDF and SVG from the suffix."""
    runs = grid(tmp_path / "runs")
    path = tmp_path / f"column.{suffix}"
    fig = drawn(monkeypatch, curves, lambda: a.plot_sweep(runs, ["method", "partition.beta"], str(path),
                                                          x="bytes", width=3.5), f"column-bytes.{suffix}")
    check_artists(fig)
    assert fig.get_size_inches()[0] == pytest.approx(3.5)
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text() and t.get_visible()]
    assert min(sizes) >= 7
    if suffix == "png":                 # the saved file's bounding box stays within the column
        assert matplotlib.image.imread(path).shape[1] <= 3.5 * figure_style.PAPER_DPI * 1.01
    head = path.read_bytes()[:5]
    assert {"png": head[1:4] == b"PNG", "pdf": head == b"%PDF-", "svg": b"<svg" in path.read_bytes()[:400]}[suffix]


def test_a_width_that_is_not_a_width_is_refused(tmp_path):
    with pytest.raises(InputError, match="width: 0.5 is not a figure width in inches"):
        figure_style.layout(3, 0.5)


def test_the_families_overview_at_a_page_width(tmp_path, monkeypatch):
    """F05: the overview at 7 in: panels in as many columns as fit, the legend within the page."""
    runs = families(tmp_path / "runs")
    path = tmp_path / "families-page.png"
    fig = drawn(monkeypatch, overview, lambda: a.plot_overview(runs, str(path), width=7), "families-page.png")
    check_artists(fig)
    assert "95% CI" in legend_titles(fig)
    assert matplotlib.image.imread(path).shape[1] <= 7 * figure_style.PAPER_DPI * 1.01


def test_report_draws_at_a_papers_width_with_the_band_it_names(tmp_path, monkeypatch):
    """`fedmpi report --plot` reaches the paper options: --interval names the band, --plot-width the width; a
    width no page holds is one line naming --plot-width, exit 2, with nothing written."""
    from fedmpi.cli import main

    grid(tmp_path / "runs")
    runs = tmp_path / "runs"
    fig = drawn(monkeypatch, overview,
                lambda: main(["report", str(runs), "--by", "method", "--by", "partition.beta", "--interval", "std",
                              "--plot-width", "3.5", "--plot", str(tmp_path / "col.png")]), "report-col.png")
    check_artists(fig)
    assert fig.get_size_inches()[0] == pytest.approx(3.5)
    assert "± 1 std" in legend_titles(fig)
    for width in ("0.5", "1e9", "nan"):
        assert main(["report", str(runs), "--plot-width", width, "--plot", str(tmp_path / "no.png"),
                     "--csv", str(tmp_path / "no.csv")]) == 2
    assert not (tmp_path / "no.png").exists() and not (tmp_path / "no.csv").exists()
