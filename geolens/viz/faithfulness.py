"""Matplotlib figures of the causal evaluation (SPEC §3, §6): faithfulness curves, multiple-choice
accuracy under masks, pruning curves and the single-head sensitivity map.

Each function returns a :class:`geolens.viz.common.PlotView` carrying the plotted numbers.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from geolens.viz.common import PlotView, new_figure

METRIC_STYLE = {
    "raw_attention": ("raw attention α", "#888888"),
    "value_weighted": ("value-weighted α‖ṽ‖", "#1f77b4"),
    "output_normalized": ("output-normalised α‖ṽ‖/‖o‖", "#2ca02c"),
    "contribution": ("contribution weights c", "#d62728"),
    "contribution_abs": ("|contribution weights| |c|", "#ff7f0e"),
    "value_zeroing": ("Value Zeroing", "#9467bd"),
    "random": ("random", "#000000"),
}
QUANTITY_LABEL = {"delta_ppl": "ΔPPL", "delta_logprob": "Δ log-prob of the target"}


def _label(metric: str) -> tuple[str, str]:
    return METRIC_STYLE.get(metric, (metric, None))


def faithfulness_curves_plot(curves: pd.DataFrame, quantity: str = "delta_ppl", *, subtitle: str = "") -> PlotView:
    """Comprehensiveness and sufficiency side by side: corpus-level value vs k with its 95% CI band.

    ``curves`` is :attr:`geolens.faithfulness.FaithfulnessResult.curves` (columns ``quantity``,
    ``quantity_lo``, ``quantity_hi``); the k axis is logarithmic, so the steep start of
    all-layer curves (k = 0.01 … 0.1) is visible.
    """
    fig = new_figure(figsize=(10, 4))
    axes = fig.subplots(1, 2, sharey=False)
    data = {}
    for ax, direction in zip(axes, ("comprehensiveness", "sufficiency")):
        sub = curves[curves.direction == direction]
        for metric, df in sub.groupby("metric", sort=False):
            name, color = _label(metric)
            x, y = df.fraction.to_numpy(), df[quantity].to_numpy()
            lo, hi = df[f"{quantity}_lo"].to_numpy(), df[f"{quantity}_hi"].to_numpy()
            ax.plot(x, y, marker="o", ms=3, label=name, color=color, ls="--" if metric == "random" else "-")
            ax.fill_between(x, lo, hi, color=color, alpha=0.15)
            data[f"{direction}/{metric}"] = dict(fraction=x, value=y, ci_low=lo, ci_high=hi)
        better = "higher = more faithful" if (direction == "comprehensiveness") == (quantity == "delta_ppl") else "lower = more faithful"
        ax.set_title(f"{direction} ({better})", fontsize=10)
        ax.set_xscale("log")
        ax.set_xlabel("fraction k of terms removed per ranking group")
        ax.set_ylabel(QUANTITY_LABEL.get(quantity, quantity) + " (corpus, 95% CI)")
        if quantity == "delta_ppl" and len(sub) and sub[quantity].abs().max() > 50:
            ax.set_yscale("symlog", linthresh=1.0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if subtitle:
        fig.suptitle(textwrap.fill(subtitle, 150), fontsize=7)
    fig.tight_layout()
    return PlotView(fig, title=f"faithfulness curves ({quantity})", data=data)


def mc_accuracy_plot(df: pd.DataFrame, *, subtitle: str = "") -> PlotView:
    """Multiple-choice accuracy vs k under comprehensiveness / sufficiency masks."""
    fig = new_figure(figsize=(10, 4))
    axes = fig.subplots(1, 2, sharey=True)
    clean = df[df.metric == "clean"].accuracy.item()
    data = {"clean": clean}
    for ax, direction in zip(axes, ("comprehensiveness", "sufficiency")):
        sub = df[df.direction == direction]
        for metric, d in sub.groupby("metric", sort=False):
            name, color = _label(metric)
            ax.plot(d.fraction, d.accuracy, marker="o", ms=3, label=name, color=color, ls="--" if metric == "random" else "-")
            data[f"{direction}/{metric}"] = dict(fraction=d.fraction.to_numpy(), accuracy=d.accuracy.to_numpy())
        ax.axhline(clean, color="k", lw=0.8, ls=":", label="clean")
        ax.set_title(direction, fontsize=10)
        ax.set_xlabel("fraction k removed")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(fontsize=8)
    if subtitle:
        fig.suptitle(textwrap.fill(subtitle, 150), fontsize=7)
    fig.tight_layout()
    return PlotView(fig, title="multiple-choice accuracy under masks", data=data)


def pruning_curves_plot(df: pd.DataFrame, *, subtitle: str = "", log: bool = True) -> PlotView:
    """ΔPPL vs retention per order; random seeds drawn thin with their mean thick."""
    fig = new_figure(figsize=(6, 4))
    ax = fig.subplots()
    data = {}
    colors = {"regime": "#d62728", "weight": "#1f77b4", "entropy": "#2ca02c"}
    rand = df[df.order.str.startswith("random")]
    for name, d in df.groupby("order", sort=False):
        if name.startswith("random"):
            ax.plot(d.retention, d.delta_ppl, color="#999999", lw=0.7)
        else:
            ax.plot(d.retention, d.delta_ppl, marker="o", ms=3, label=name, color=colors.get(name))
        data[name] = dict(retention=d.retention.to_numpy(), delta_ppl=d.delta_ppl.to_numpy())
    if len(rand):
        m = rand.groupby("retention", sort=False).delta_ppl.mean()
        ax.plot(m.index, m.values, color="k", ls="--", label=f"random (mean of {rand.order.nunique()} seeds)")
    ax.invert_xaxis()
    if log:
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("retention (share of heads kept)")
    ax.set_ylabel("ΔPPL")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if subtitle:
        ax.set_title(textwrap.fill(subtitle, 90), fontsize=7)
    return PlotView(fig, title="pruning curves", data=data)


def sensitivity_map_plot(delta_ppl: np.ndarray, critical: pd.DataFrame | None = None, *, subtitle: str = "") -> PlotView:
    """Layer × head map of single-head ablation ΔPPL; critical heads circled."""
    fig = new_figure(figsize=(5, 7))
    ax = fig.subplots()
    vmax = float(np.abs(delta_ppl).max()) or 1.0
    im = ax.imshow(delta_ppl, aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    fig.colorbar(im, ax=ax, label="ΔPPL (one head ablated)")
    if critical is not None and len(critical):
        ax.scatter(critical["head"], critical["layer"], s=80, facecolors="none", edgecolors="k", label="|robust z| > 3.5")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if subtitle:
        ax.set_title(textwrap.fill(subtitle, 60), fontsize=7)
    return PlotView(fig, title="single-head sensitivity", data=dict(delta_ppl=delta_ppl))
