"""Matplotlib figures of the causal evaluation (docs/method.md §3, §6): faithfulness curves, multiple-choice
accuracy (clean, and under masks), pruning curves and the single-head sensitivity map.

Each function returns a :class:`geolens.viz.common.PlotView` carrying the plotted numbers.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from geolens.metrics import find_metric
from geolens.viz.common import PlotView, new_figure

QUANTITY_LABEL = {"delta_ppl": "ΔPPL", "delta_logprob": "Δ log-prob of the target"}


def _label(metric: str) -> tuple[str, str | None]:
    """(legend label, colour) of a metric from :mod:`geolens.metrics`; (name, None) if unregistered."""
    m = find_metric(metric)
    return (m.label, m.colour) if m is not None else (metric, None)


def _style(metric: str, index: int) -> dict:
    """The metric's own marker and line style, so that curves drawn on top of each other stay visible."""
    m = find_metric(metric)
    marker = m.marker if m is not None and m.marker else "os^Dv*"[index % 6]
    ls, ms = (m.linestyle, m.markersize) if m is not None else ("-", 5)
    return dict(marker=marker, ls=ls, ms=ms, markerfacecolor="none", markeredgewidth=1.2, lw=1.3)


def _coincide_reason(a: str, b: str) -> str | None:
    """Why two metrics' curves coincide by construction (``Metric.same_ranking_reason``), if they do."""
    for x, y in ((a, b), (b, a)):
        m = find_metric(x)
        if m is not None and m.same_ranking_as == y and m.same_ranking_reason:
            return m.same_ranking_reason
    return None


def coinciding_curves(curves: dict[str, np.ndarray], *, rel_tol: float = 0.01) -> list[dict]:
    """Pairs of curves (same x) that a reader cannot tell apart on the plot.

    Two curves coincide when their largest difference is at most ``rel_tol`` of the panel's
    y-range (``identical`` when it is exactly 0). Each entry gives both metrics, the largest
    difference and, for pairs that coincide by construction, the reason.
    """
    names = list(curves)
    values = [np.asarray(curves[n], dtype=float) for n in names]
    finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.array([])
    span = float(finite.max() - finite.min()) if finite.size else 0.0
    out = []
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            if values[a].shape != values[b].shape:
                continue
            diff = float(np.nanmax(np.abs(values[a] - values[b]))) if values[a].size else 0.0
            if diff <= rel_tol * span or diff == 0.0:
                default = "the same mean at every k" if diff == 0.0 else f"difference ≤ {rel_tol:.0%} of the y-range"
                reason = _coincide_reason(names[a], names[b]) or default
                out.append(dict(a=names[a], b=names[b], max_diff=diff, identical=diff == 0.0, reason=reason))
    return out


def _coincidence_note(pairs: list[dict]) -> list[str]:
    lines = []
    for p in pairs:
        how = "identical" if p["identical"] else f"within {p['max_diff']:.3g}"
        lines.append(f"{p['direction']}: {_label(p['a'])[0]} and {_label(p['b'])[0]} coincide ({how}): {p['reason']}.")
    return lines


def _direction_panels(
    axes, df: pd.DataFrame, column: str, *, value_key: str, band: bool, rel_tol: float
) -> tuple[dict, list[dict]]:
    """Comprehensiveness on ``axes[0]``, sufficiency on ``axes[1]``: one curve of ``column`` against k
    per metric, each with its own label, colour, marker and line style (with ``band``, the CI band
    ``column_lo`` … ``column_hi``).

    Returns the plotted numbers (``"direction/metric"`` → ``fraction``, ``value_key`` and, with the
    band, ``ci_low`` / ``ci_high``) and the pairs of curves that coincide in each panel
    (:func:`coinciding_curves` with ``rel_tol``, each with its ``direction``).
    """
    data, coincide = {}, []
    for ax, direction in zip(axes, ("comprehensiveness", "sufficiency")):
        panel = {}
        for index, (metric, d) in enumerate(df[df.direction == direction].groupby("metric", sort=False)):
            name, color = _label(metric)
            x, y = d.fraction.to_numpy(), d[column].to_numpy()
            ax.plot(x, y, label=name, color=color, **_style(metric, index))
            entry = {"fraction": x, value_key: y}
            if band:
                entry.update(ci_low=d[f"{column}_lo"].to_numpy(), ci_high=d[f"{column}_hi"].to_numpy())
                ax.fill_between(x, entry["ci_low"], entry["ci_high"], color=color, alpha=0.12)
            data[f"{direction}/{metric}"] = entry
            panel[metric] = y
        coincide += [dict(direction=direction, **p) for p in coinciding_curves(panel, rel_tol=rel_tol)]
    return data, coincide


LEGEND_WIDTH = 0.2  # share of the figure width kept right of the panels for the legend


def _finish(fig, subtitle: str, notes: list[str], legend_axes=None) -> None:
    """Subtitle on top, coincidence notes under the panels, and the legend of ``legend_axes``
    right of the panels, outside every data area; the layout leaves room for all three."""
    if subtitle:
        fig.suptitle(textwrap.fill(subtitle, 150), fontsize=7)
    bottom = 0.0
    if notes:
        text = "\n".join(textwrap.fill(n, 170) for n in notes)
        bottom = min(0.3, 0.034 * (text.count("\n") + 1))
        fig.text(0.01, 0.005, text, fontsize=7, va="bottom", ha="left", color="#333333")
    right = 1.0 - LEGEND_WIDTH if legend_axes is not None else 1.0
    fig.tight_layout(rect=(0, bottom, right, 1))
    if legend_axes is not None:
        # added after the layout: the legend belongs to the first panel (ax.get_legend()) but sits
        # in the figure's right margin, outside every data area
        legend_axes.legend(
            fontsize=8,
            loc="center left",
            bbox_to_anchor=(right + 0.01, 0.5 + bottom / 2),
            bbox_transform=fig.transFigure,
            frameon=False,
        )


def fraction_ticks(ax, fractions, *, min_gap: float = 0.16) -> list[float]:
    """Label the log k axis at the fractions used, thinned so that labels never overlap: a
    fraction is labelled when it lies at least ``min_gap`` decades from the previous label
    (the largest is always kept); minor ticks get no label. Returns the labelled fractions."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    ks = sorted({float(k) for k in fractions if np.isfinite(k) and k > 0})
    kept: list[float] = []
    for k in ks:
        if not kept or np.log10(k) - np.log10(kept[-1]) >= min_gap:
            kept.append(k)
        elif k == ks[-1]:
            kept[-1] = k
    ax.xaxis.set_major_locator(FixedLocator(kept))
    ax.set_xticklabels([f"{k:g}" for k in kept], fontsize=8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    return kept


def faithfulness_curves_plot(curves: pd.DataFrame, quantity: str = "delta_ppl", *, subtitle: str = "") -> PlotView:
    """Comprehensiveness and sufficiency side by side: corpus-level value vs k with its 95% CI band.

    ``curves`` is :attr:`geolens.faithfulness.FaithfulnessResult.curves` (columns ``quantity``,
    ``quantity_lo``, ``quantity_hi``); the k axis is logarithmic, so the steep start of
    all-layer curves (k = 0.01 … 0.1) is visible. Every metric has its own marker (hollow,
    decreasing size) and line style, so curves that lie on top of each other stay visible; pairs
    that coincide are named under the figure, with the reason (``data["coincide"]``).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> protocol = geolens.MaskingConfig(fractions=(0.1, 0.5))
    >>> res = geolens.faithfulness_curves(model, tiny_tokens(model, length=16), protocol,
    ...                                   metrics=["raw_attention", "contribution"], progress=False, n_boot=20)
    >>> view = faithfulness_curves_plot(res.curves)
    >>> type(view).__name__, len(view.figure.axes)  # comprehensiveness, sufficiency
    ('PlotView', 2)
    """
    fig = new_figure(figsize=(12, 4.6))
    axes = fig.subplots(1, 2, sharey=False)
    data, coincide = _direction_panels(axes, curves, quantity, value_key="value", band=True, rel_tol=0.01)
    for ax, direction in zip(axes, ("comprehensiveness", "sufficiency")):
        better = (
            "higher = more faithful"
            if (direction == "comprehensiveness") == (quantity == "delta_ppl")
            else "lower = more faithful"
        )
        ax.set_title(f"{direction} ({better})", fontsize=10)
        ax.set_xscale("log")
        fraction_ticks(ax, curves.fraction)
        ax.set_xlabel("fraction k of terms removed per ranking group (log scale)")
        ax.set_ylabel(QUANTITY_LABEL.get(quantity, quantity) + " (corpus, 95% CI)")
        sub = curves[curves.direction == direction]
        if quantity == "delta_ppl" and len(sub) and sub[quantity].abs().max() > 50:
            ax.set_yscale("symlog", linthresh=1.0)
        ax.grid(alpha=0.3)
    data["coincide"] = coincide
    _finish(fig, subtitle, _coincidence_note(coincide), legend_axes=axes[0])
    return PlotView(fig, title=f"faithfulness curves ({QUANTITY_LABEL.get(quantity, quantity)} against k)", data=data)


def mc_accuracy_plot(df: pd.DataFrame, *, subtitle: str = "") -> PlotView:
    """Multiple-choice accuracy vs k under comprehensiveness / sufficiency masks.

    Accuracies of a few questions take few values, so curves often coincide: each metric has its
    own marker and line style, and coinciding pairs are named under the figure.
    """
    fig = new_figure(figsize=(12, 4.6))
    axes = fig.subplots(1, 2, sharey=True)
    clean = df[df.metric == "clean"].accuracy.item()
    curves, coincide = _direction_panels(axes, df, "accuracy", value_key="accuracy", band=False, rel_tol=0.0)
    data = {"clean": clean, **curves}
    notes = []
    for ax, direction in zip(axes, ("comprehensiveness", "sufficiency")):
        same = sorted({_label(m)[0] for p in coincide if p["direction"] == direction for m in (p["a"], p["b"])})
        if same:
            notes.append(
                f"{direction}: identical accuracies for {', '.join(same)} (few questions: accuracy moves in steps of 1/n)."
            )
        ax.axhline(clean, color="k", lw=0.8, ls=":", label="clean")
        ax.set_title(direction, fontsize=10)
        ax.set_xlabel("fraction k removed")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    data["coincide"] = coincide
    _finish(fig, subtitle, notes, legend_axes=axes[0])
    return PlotView(fig, title="multiple-choice accuracy under masks", data=data)


def mc_clean_plot(summary: pd.DataFrame) -> PlotView:
    """Clean multiple-choice accuracy per task with its 95% CI and chance (mean 1/#choices); the
    tasks at chance (not ``eligible``, excluded from masking) in grey. ``summary``: the task table of
    :func:`geolens.faithfulness.multiple_choice.run_multiple_choice` (``MCResult.tasks``)."""
    fig = new_figure(figsize=(7, 3.4))
    ax = fig.subplots()
    x = np.arange(len(summary))
    acc = summary.accuracy.to_numpy()
    err = np.stack([acc - summary.ci_low.to_numpy(), summary.ci_high.to_numpy() - acc])
    ax.bar(
        x,
        acc,
        yerr=err,
        capsize=3,
        color=["tab:blue" if e else "tab:gray" for e in summary.eligible],
        label="accuracy [95% CI]",
    )
    ax.scatter(x, summary.chance, marker="_", s=400, color="k", zorder=3, label="chance (mean 1/n choices)")
    ax.set_xticks(
        x,
        [
            f"{t}\n(n={n}{'' if e else ', excluded'})"
            for t, n, e in zip(summary.task, summary.n_questions, summary.eligible)
        ],
        fontsize=7,
    )
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return PlotView(fig, title="multiple choice, clean (grey: at chance, excluded)", data={"summary": summary})


def _delta_ppl_scale(ax, values: np.ndarray) -> str:
    """A y scale that the data fill: ``log`` when every ΔPPL is positive (limits from the data),
    ``symlog`` (linear within ±1) when some are ≤ 0 and the range exceeds 50, else linear; the
    limits never reach a sign the data do not have. Returns the scale's name."""
    v = values[np.isfinite(values)]
    if not v.size:
        return "linear"
    lo, hi = float(v.min()), float(v.max())
    if lo > 0 and hi / lo > 10:
        ax.set_yscale("log")
        ax.set_ylim(lo / 1.5, hi * 1.5)
        return "log"
    if max(abs(lo), abs(hi)) > 50 and lo <= 0:
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(lo * 1.5 if lo < -1 else min(lo, 0) - 0.5, hi * 1.5 if hi > 1 else 1.0)
        return "symlog"
    pad = 0.05 * (hi - lo) if hi > lo else max(abs(hi), 1.0) * 0.05
    ax.set_ylim(lo - pad, hi + pad)
    return "linear"


def pruning_curves_plot(df: pd.DataFrame, *, subtitle: str = "", log: bool = True) -> PlotView:
    """ΔPPL vs retention per order; random seeds drawn thin with their mean thick.

    With ``log``, the y scale follows the data (:func:`_delta_ppl_scale`: log when every ΔPPL is
    positive and spans more than a decade, so no empty half of a symmetric-log axis); the legend
    sits right of the axes.

    >>> from geolens.pruning import pruning_curves, pruning_orders
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model, length=16)
    >>> curves = pruning_curves(model, tokens, pruning_orders(model, tokens), (0.75, 0.5), mode="zero", progress=False)
    >>> view = pruning_curves_plot(curves)
    >>> type(view).__name__, len(view.figure.axes)
    ('PlotView', 1)
    """
    fig = new_figure(figsize=(7.5, 4))
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
        n_seeds = rand.order.nunique()
        label = (
            "random order (1 seed)"
            if n_seeds == 1
            else f"random orders (mean of {n_seeds} seeds; thin grey: each seed)"
        )
        ax.plot(m.index, m.values, color="k", ls="--", label=label)
    ax.invert_xaxis()
    scale = _delta_ppl_scale(ax, df.delta_ppl.to_numpy(dtype=float)) if log else "linear"
    ax.set_xticks(sorted({float(r) for r in df.retention}))
    ax.set_xlabel("retention (share of heads kept)")
    ax.set_ylabel(
        "ΔPPL vs the unpruned model" + {"log": " (log scale)", "symlog": " (symmetric log scale)"}.get(scale, "")
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    if subtitle:
        ax.set_title(textwrap.fill(subtitle, 90), fontsize=7)
    fig.tight_layout()
    return PlotView(fig, title="pruning curves", data=data)


def sensitivity_map_plot(
    delta_ppl: np.ndarray, critical: pd.DataFrame | None = None, *, subtitle: str = ""
) -> PlotView:
    """Layer × head map of single-head ablation ΔPPL; critical heads circled."""
    fig = new_figure(figsize=(5, 7))
    ax = fig.subplots()
    vmax = float(np.abs(delta_ppl).max()) or 1.0
    im = ax.imshow(delta_ppl, aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    fig.colorbar(im, ax=ax, label="ΔPPL (one head ablated)")
    if critical is not None and len(critical):
        ax.scatter(
            critical["head"], critical["layer"], s=80, facecolors="none", edgecolors="k", label="|robust z| > 3.5"
        )
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    if subtitle:
        ax.set_title(textwrap.fill(subtitle, 60), fontsize=7)
    return PlotView(fig, title="single-head sensitivity", data=dict(delta_ppl=delta_ppl))
