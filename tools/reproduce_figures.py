"""tools/reproduce.py's figures: each paper's figure (DOCS/reproduction_<paper>.png) from its groups of runs
(config name -> the seeds' runs), with the panel and figure helpers that reproduce_shakespeare.py's entry
also draws with. Kept beside reproduce.py, which loads it by path, so that the script does not outgrow a
module; drawing needs only the runs, not the papers' settings or the report.
"""

from __future__ import annotations

import numpy as np

from fedmpi import analysis
from fedmpi.analysis import report


def _panel(ax, groups, labels, title, metric="test_acc"):
    chosen = {label: groups[name] for name, label in labels}
    analysis.draw_groups(ax, chosen, metric, "round", band="std")      # the ylabel says "mean ± std"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _figure(panels, path, ylabel="test accuracy (mean ± std over seeds)"):
    plt = analysis.pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, draw in zip(axes[0], panels):
        draw(ax)
    axes[0][0].set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return plt


def zhao_figure(groups, path):
    def final_vs_beta(ax):
        betas = [0, 5, 10, 20]
        finals = [[report.accuracy_figures(r.metrics["round"], r.metrics["test_acc"])[0]
                   for r in groups[f"share_beta{b}"]] for b in betas]
        ax.errorbar(betas, [np.mean(f) for f in finals], yerr=[np.std(f, ddof=1) if len(f) > 1 else 0 for f in finals],
                    marker="o", capsize=3)
        ax.set_xlabel("beta = |G| / |D| (%)")
        ax.set_title("1-class: final accuracy against beta", fontsize=10)
        ax.grid(alpha=0.3)

    _figure([lambda ax: _panel(ax, groups, [("fedavg_iid", "IID"), ("fedavg_2class", "2-class"),
                                             ("fedavg_1class", "1-class")], "FedAvg: IID vs non-IID"),
             lambda ax: _panel(ax, groups, [(f"share_beta{b}", f"beta {b}%") for b in (0, 5, 10, 20)],
                               "1-class with data sharing (alpha 0.5, warm-up)"),
             final_vs_beta], path)


def fsl_figure(groups, path):
    panels = [lambda ax, c=c: _panel(ax, groups, [(f"fedavg_c{c}", "FL"), (f"ds_c{c}", "DS"), (f"fsl_c{c}", "FSL")],
                                     f"C = {c} classes per client") for c in (1, 2, 5)]
    panels.append(lambda ax: _panel(ax, groups, [("fsl_gamma05_c2", "gamma 0.5"), ("fsl_c2", "gamma 1"),
                                                 ("fsl_gamma2_c2", "gamma 2")], "FSL, C = 2: gamma"))
    if "synthetic_fsl" in groups:
        panels.append(lambda ax: _panel(ax, groups, [(f"synthetic_{m}", label) for m, label in
                                                     (("fedavg", "FL"), ("ds", "DS"), ("fsl", "FSL"))],
                                        "SYNTHETIC(1,1), 30 users"))
    _figure(panels, path)


def fedskip_figure(groups, path):
    names = ("fedskip", "fedavg", "fedprox", "scaffold", "fednova", "moon", "feddyn")
    _figure([lambda ax: _panel(ax, groups, [(n, n) for n in names], "Dirichlet(0.5), 10 clients, momentum 0.9")],
            path)


def safl_figure(groups, path):
    labels = [("fedavg_group_a", "FedAvg, group A only"), ("fedavg", "FedAvg, A + B"), ("safl", "SAFL, A + B"),
              ("safl_gated", "gated SAFL, A + B")]

    def uploads(ax):
        for name, label in labels:
            runs = groups[name]
            curves = np.array([np.cumsum(np.nan_to_num(r.metrics["uploads"])) for r in runs])
            ax.plot(np.arange(1, curves.shape[1] + 1), curves.mean(axis=0), label=label)
        ax.set_title("cumulative uploads", fontsize=10)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    _figure([lambda ax: _panel(ax, groups, labels, "digits 0-4: group A all five, group B only '2'"),
             lambda ax: _panel(ax, groups, [("safl_gated_half", "mix at next selection"),
                                            ("safl_gated_half_eor", "mix at end of round")],
                               "gated SAFL, 5 of 10 clients per round"),
             uploads], path)
