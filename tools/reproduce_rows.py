"""tools/reproduce.py's table: one row per setting of a paper from its finished runs (mean and sample std over
the seeds of the final and best accuracy, the rise and target rounds, the late rise, uploads, wall time, and a
paper's own diagnostics: Zhao's weight divergence and shared-set EMD, FSL's server loss and largest fall), and
that table as Markdown. Kept beside reproduce.py, which loads it by path; pure functions of the runs."""

from __future__ import annotations

import numpy as np

from fedmpi import analysis
from fedmpi.analysis import report


def shared_emd(run):
    """Sample-weighted mean EMD of the clients' label distributions after data sharing (NaN without)."""
    return report.mean_client_emd(run.groups.get("partition/shared", {}))


def table_rows(paper, groups, late_rise):
    rows = {}
    for s in paper.settings:
        members = groups[s.config]
        summary = analysis.group_summary(members, paper.target, include="all")   # diverged runs counted: see `diverged`
        row = {"setting": s.label, "paper": s.paper, "runs": summary["n"], "emd": summary["emd"]}
        if paper.key == "zhao":
            row["emd_shared"] = float(np.mean([shared_emd(r) for r in members]))
            warm = [r.metrics["warmup_epochs"][0] for r in members if "warmup_epochs" in r.metrics]
            row["warmup_epochs"] = float(np.mean(warm)) if warm else np.nan
            if all("weight_divergence" in r.metrics for r in members):
                last = np.array([r.metrics["weight_divergence"][-1] for r in members], dtype=np.float64)
                row["divergence"] = float(last.mean())
                row["divergence_std"] = float(last.std(ddof=1)) if len(last) > 1 else np.nan
        figures = np.array([(*report.accuracy_figures(r.metrics["round"], r.metrics["test_acc"], paper.window),
                             late_rise(r.metrics["round"], r.metrics["test_acc"], paper.window))
                            for r in members])          # (final, best, rise, late rise) with the paper's window
        for i, key in enumerate(("final_acc", "best_acc", "rise_round", "late_rise")):
            row[key], row[key + "_std"] = _mean_std_of(figures[:, i])
        if paper.key == "fsl":
            row.update(fsl_figures(members, paper.window))
        row["target_round"], row["target_round_std"] = summary["target_round"], summary["target_round_std"]
        row["reached"] = summary["reached"]
        # runtime.on_nonfinite: continue keeps a diverged run going; say how many did
        bad = sum(not np.isfinite(np.asarray(r.metrics["train_loss"], dtype=np.float64)).all() for r in members)
        row["diverged"] = f"{bad}/{len(members)}"
        row["uploads"], row["uploads_std"] = summary["uploads"], summary["uploads_std"]
        row["wall_s"], row["wall_s_std"] = summary["wall_s"], summary["wall_s_std"]
        rows[s.config] = row
    return rows


def _mean_std_of(values):
    """Mean and sample std of the finite `values` (NaN for none; the std NaN for fewer than two)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return (float(values.mean()) if len(values) else np.nan,
            float(values.std(ddof=1)) if len(values) > 1 else np.nan)


def fsl_figures(members, window):
    """FSL's two diagnostics: the server's own loss on D0 over the last `window` rounds (NaN for a method
    without server learning; a loss near 0 is a server set the server has fitted) and the largest fall of the
    test accuracy below its best so far (a collapse that the final accuracy may hide)."""
    loss = [np.nanmean(np.asarray(r.metrics["server_loss"], dtype=np.float64)[-window:])
            if "server_loss" in r.metrics else np.nan for r in members]
    fall = []
    for r in members:
        acc = np.asarray(r.metrics["test_acc"], dtype=np.float64)
        acc = acc[np.isfinite(acc)]
        fall.append(float(np.max(np.maximum.accumulate(acc) - acc)) if len(acc) else np.nan)
    (sl, sl_std), (fa, fa_std) = _mean_std_of(loss), _mean_std_of(fall)
    return {"server_loss": sl, "server_loss_std": sl_std, "fall": fa, "fall_std": fa_std}


COLUMNS = {"setting": "setting", "paper": "paper's number or claim", "runs": "runs", "emd": "client EMD",
           "emd_shared": "EMD after sharing", "warmup_epochs": "warm-up epochs", "final_acc": "final acc",
           "best_acc": "best acc", "rise_round": "rise round", "late_rise": "late rise",
           "reached": "reached target", "target_round": "rounds to target", "uploads": "uploads", "wall_s": "wall s",
           "divergence": "weight divergence (last round)", "diverged": "diverged (non-finite loss)",
           "server_loss": "server loss on D0", "fall": "largest fall"}


def markdown_table(rows):
    rows = list(rows.values())
    keys = [k for k in rows[0] if not k.endswith("_std")]
    if all(r["diverged"].startswith("0/") for r in rows):
        keys.remove("diverged")             # the column only where a run diverged
    head = [COLUMNS.get(k, k) for k in keys]
    align = [":--" if i < 2 else "--:" for i in range(len(keys))]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    for r in rows:
        cells = []
        for k in keys:
            if k in ("warmup_epochs", "emd_shared", "divergence", "late_rise", "server_loss", "fall"):
                digits = {"warmup_epochs": 1, "server_loss": 4}.get(k, 3)
                text = "-" if not np.isfinite(r[k]) else f"{r[k]:.{digits}f}"
                if np.isfinite(r.get(k + "_std", np.nan)):
                    text += f" ± {r[k + '_std']:.{digits}f}"
                cells.append(text)
            else:
                cells.append(report._cell(r, k))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
