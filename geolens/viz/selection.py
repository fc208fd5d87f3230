"""Figures of the token-selection geometry (docs/method.md §5): F_N vs N, top-N vs random, with/without sink.

- :func:`f_vs_n_plot`: document-level mean F_N (with bootstrap CIs) against N (log scale) for the
  top-N selection and the random baseline, sink kept vs excluded, one panel per distance.
- :func:`f_by_layer_plot`: mean F_N per layer for a few N (top-N solid, random dashed).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.viz.common import PlotView, new_figure


def f_vs_n_plot(scores: pd.DataFrame, *, space: str = "value", by: str = "attention", title: str = "") -> PlotView:
    """``scores``: the ``scores`` table of :meth:`SelectionAnalysis.result` (one corpus)."""
    s = scores[(scores.metric == "f") & (scores.space == space) & (scores.by == by)]
    distances = [d for d in ("euclidean", "cosine") if d in set(s.distance)]
    fig = new_figure(figsize=(4.2 * len(distances), 3.3))
    axes = fig.subplots(1, len(distances), squeeze=False)[0]
    styles = {("top", "keep"): ("C0", "-"), ("top", "exclude"): ("C0", "--"), ("top", "force"): ("C0", ":"),
              ("random", "keep"): ("C3", "-"), ("random", "exclude"): ("C3", "--")}  # fmt: skip
    for ax, dist in zip(axes, distances):
        for (kind, sink), (color, ls) in styles.items():
            g = s[(s.distance == dist) & (s.kind == kind) & (s.sink == sink)].sort_values("N")
            if g.empty:
                continue
            label = f"{'top-N' if kind == 'top' else 'random'}, sink {sink}"
            ax.plot(g.N, g["mean"], color=color, ls=ls, marker="o", ms=3, label=label)
            ax.fill_between(g.N, g.lo, g.hi, color=color, alpha=0.12)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N")
        ax.set_ylabel("F_N (document mean, 95% CI)")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{dist} distance, {space} space, ranked by {by}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return PlotView(fig, title=title or "F_N vs N", data={"scores": s})


def f_by_layer_plot(by_layer: pd.DataFrame, condition: str, sizes=(1, 4, 16, 64), *, title: str = "") -> PlotView:
    """Mean F_N per layer (top-N solid, random dashed) for the given N."""
    d = by_layer[by_layer.condition == condition]
    fig = new_figure(figsize=(5.0, 3.2))
    ax = fig.subplots()
    for k, n in enumerate(n for n in sizes if n in set(d.N)):
        for kind, ls in (("top", "-"), ("random", "--")):
            g = d[(d.N == n) & (d.kind == kind)].sort_values("layer")
            if not g.empty:
                ax.plot(g.layer, g.f, color=f"C{k}", ls=ls, label=f"N={n} {kind}")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean F_N")
    ax.set_ylim(0, 1.02)
    ax.set_title(title or condition, fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return PlotView(fig, title=title or condition, data={"by_layer": d})


def similarity_decay_plot(lag_sim: np.ndarray, fit: pd.DataFrame, *, layers=None, title: str = "") -> PlotView:
    """Head-mean cross-token similarity vs distance for a few layers, with the exponential fit."""
    L = lag_sim.shape[0]
    layers = layers or sorted({0, L // 4, L // 2, 3 * L // 4, L - 1})
    fig = new_figure(figsize=(5.0, 3.2))
    ax = fig.subplots()
    delta = np.arange(1, lag_sim.shape[-1] + 1)
    for k, l in enumerate(layers):
        ax.plot(delta, lag_sim[l].mean(0), color=f"C{k}", label=f"layer {l}")
        rows = fit[fit.layer == l]
        curve = np.mean([r.decay_offset + r.decay_amplitude * np.exp(-delta / r.decay_length) for r in rows.itertuples()], axis=0)
        ax.plot(delta, curve, color=f"C{k}", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("token distance δ")
    ax.set_ylabel("mean cos(u_i, u_{i−δ}) (non-sink)")
    ax.set_title(title or "cross-token value similarity (dotted: per-head exponential fits, averaged)", fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return PlotView(fig, title=title, data={"layers": layers})
