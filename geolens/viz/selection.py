"""Figures of the token-selection geometry (docs/method.md §5): F_N vs N, top-N vs random, with/without sink.

- :func:`f_vs_n_plot`: document-level mean F_N (with bootstrap CIs) against N (log scale) for the
  top-N selection and the random baseline, sink kept vs excluded, one panel per distance. The two
  random curves use the *same* random rankings: with the sink excluded the set is the top N of
  the ranking among positions 1 … t, with it kept among 0 … t, so the sets differ only when the
  draw ranks the sink among the first N (probability N/(t+1)). The curves are therefore close
  but not equal by construction; they are drawn differently (wide pale line under a thin dashed
  one, different markers) and, when they lie within 1% of the axis of each other, a note under
  the panels says so with the largest difference (``data["random_coincide"]``).
- :func:`f_by_layer_plot`: mean F_N per layer for a few N (top-N solid, random dashed).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.viz.common import PlotView, new_figure


def f_vs_n_plot(scores: pd.DataFrame, *, space: str = "value", by: str = "attention", title: str = "") -> PlotView:
    """``scores``: the ``scores`` table of :meth:`SelectionAnalysis.result` (one corpus).

    >>> from geolens.runner import run_corpus
    >>> from geolens.selection.analysis import Condition, SelectionAnalysis
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> analysis = SelectionAnalysis.for_model(model, 16, conditions=[Condition("value", "cosine")], n_random=2)
    >>> _ = run_corpus(model, tiny_tokens(model, length=16), [analysis], progress=False)
    >>> view = f_vs_n_plot(analysis.result(n_boot=50)["scores"])
    >>> type(view).__name__, len(view.figure.axes)  # one panel per distance
    ('PlotView', 1)
    """
    s = scores[(scores.metric == "f") & (scores.space == space) & (scores.by == by)]
    distances = [d for d in ("euclidean", "cosine") if d in set(s.distance)]
    fig = new_figure(figsize=(4.2 * len(distances) + 2.4, 3.5))
    axes = fig.subplots(1, len(distances), squeeze=False)[0]
    # (colour, line style, marker, line width, alpha): the two random curves nearly coincide, so
    # "sink kept" is a wide pale line and "sink excluded" a thin dashed line with other markers on top
    styles = {
        ("top", "keep"): ("C0", "-", "o", 1.5, 1.0),
        ("top", "exclude"): ("C0", "--", "s", 1.5, 1.0),
        ("top", "force"): ("C0", ":", "^", 1.5, 1.0),
        ("random", "keep"): ("C3", "-", "o", 4.0, 0.35),
        ("random", "exclude"): ("#8b0000", "--", "x", 1.2, 1.0),
    }
    names = {"keep": "sink kept", "exclude": "sink excluded", "force": "sink forced in"}
    coincide = {}
    for ax, dist in zip(axes, distances):
        curves = {}
        for (kind, sink), (color, ls, marker, lw, alpha) in styles.items():
            g = s[(s.distance == dist) & (s.kind == kind) & (s.sink == sink)].sort_values("N")
            if g.empty:
                continue
            label = f"{'top-N' if kind == 'top' else 'random N-set'}, {names[sink]}"
            ax.plot(
                g.N,
                g["mean"],
                color=color,
                ls=ls,
                marker=marker,
                ms=4 if lw < 3 else 6,
                lw=lw,
                alpha=alpha,
                label=label,
            )
            ax.fill_between(g.N, g.lo, g.hi, color=color, alpha=0.10)
            curves[kind, sink] = g.set_index("N")["mean"]
        if ("random", "keep") in curves and ("random", "exclude") in curves:
            diff = (curves["random", "keep"] - curves["random", "exclude"]).abs()
            coincide[dist] = float(diff.max()) if len(diff.dropna()) else float("nan")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (log scale)")
        ax.set_ylabel("F_N (document mean, 95% CI)")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{dist} distance, {space} space, ranked by {by}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.03, 1.0), frameon=False)
    bottom = 0.0
    close = {d: v for d, v in coincide.items() if np.isfinite(v) and v <= 0.01 * 1.02}
    if close:
        worst = max(close.values())
        fig.text(
            0.01,
            0.01,
            "The two random curves nearly coincide (largest difference "
            f"{worst:.2g}): they use the same random rankings, and the sets differ only when the sink "
            "is drawn among the first N (probability N/(t+1)); they are not equal by construction.",
            fontsize=7,
            ha="left",
            va="bottom",
            wrap=True,
            color="#333333",
        )
        bottom = 0.1
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return PlotView(fig, title=title or "F_N vs N", data={"scores": s, "random_coincide": coincide})


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
        curve = np.mean(
            [r.decay_offset + r.decay_amplitude * np.exp(-delta / r.decay_length) for r in rows.itertuples()], axis=0
        )
        ax.plot(delta, curve, color=f"C{k}", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("token distance δ")
    ax.set_ylabel("mean cos(u_i, u_{i−δ}) (non-sink)")
    ax.set_title(title or "cross-token value similarity (dotted: per-head exponential fits, averaged)", fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return PlotView(fig, title=title, data={"layers": layers})
