"""Matplotlib figures of the sink analyses (docs/method.md §4); each returns a :class:`PlotView`.

A :class:`~geolens.viz.common.PlotView` wraps the matplotlib ``Figure`` (``.figure``), saves to
PNG (``.save(path)``) and carries the numbers it shows in ``.data``.

- :func:`sink_layer_bars`: per layer, mean sink rate and Gu et al. sink share, sink/non-sink norm
  ratios, sink cosines (value and projected space);
- :func:`decomposition_bars`: per layer, the variance shares of log|c| for sink and tail sources;
- :func:`norm_curve_plot`: mean ‖o_i^h‖ per sink-rate bin with 95% CIs and the quadratic fit;
- :func:`drift_plot`: cosine with the semantic cone, relative output norm and ΔPPL against λ;
- :func:`controls_plot`: the sink-intervention controls (ΔPPL, head-output norm ratio and cone
  cosine change with CIs, all layers at once and per layer).
"""

from __future__ import annotations

import numpy as np

from geolens.claims import counted
from geolens.viz.common import PlotView, new_figure


def sink_layer_bars(geometry) -> PlotView:
    """Four panels of per-layer bars from a :class:`~geolens.sinks.SinkGeometryResult`.

    >>> from geolens.sinks import sink_geometry
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> view = sink_layer_bars(sink_geometry(model, tiny_tokens(model, length=16)))
    >>> type(view).__name__, len(view.figure.axes)  # view.save("sinks.png")
    ('PlotView', 4)
    """
    df = geometry.layers
    x = df["layer"].to_numpy()
    fig = new_figure(figsize=(11, 6.5))
    axes = fig.subplots(2, 2, sharex=True)
    panels = (  # left bars, right bars (column, legend label each), title
        (
            "sink_rate",
            "mean α_i0 (i ≥ 1)",
            "gu_sink_share",
            f"Gu et al. share of heads, ε={geometry.eps:g}",
            "sink rate",
        ),
        ("value_norm_ratio", "‖v_0‖ / mean‖v_j‖", "proj_norm_ratio", "‖ṽ_0‖ / mean‖ṽ_j‖", "sink / non-sink value norm"),
        (
            "value_cos_tail",
            "cos(v_0, v_j)",
            "proj_cos_tail",
            "cos(ṽ_0, ṽ_j)",
            "sink cosine with non-sink values (mean over j > 0)",
        ),
        (
            "value_cos_mean_dir",
            "cos(v_0, mean v_j)",
            "proj_cos_mean_dir",
            "cos(ṽ_0, mean ṽ_j)",
            "sink cosine with the mean non-sink direction",
        ),
    )
    for ax, (left, left_label, right, right_label, title) in zip(axes.ravel(), panels):
        ax.bar(x - 0.2, df[left], 0.4, label=left_label)
        ax.bar(x + 0.2, df[right], 0.4, label=right_label)
        ax.set_title(title)
    rate, norm, cos_tail, cos_mean = axes.ravel()
    rate.set_ylim(0, 1)
    norm.axhline(1, color="k", lw=0.6)
    norm.set_yscale("log")
    for ax in (cos_tail, cos_mean):
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel("layer")
    for ax in axes.ravel():
        ax.legend(fontsize=7)
    fig.suptitle(f"Sink geometry per layer (mean over heads; {geometry.model_mode})")
    fig.tight_layout()
    return PlotView(fig, title="sink geometry per layer", data={"layers": df})


def decomposition_bars(decomposition) -> PlotView:
    """Per-layer signed variance shares Cov(X, F)/Var X of X = log|c_ij|, sink vs tail (pooled over heads).

    The three shares (attention, relative norm, cosine) add up to 1 exactly, but each one is signed:
    a negative share means that factor varies against the sum and cancels part of the others'
    variance, and then another share exceeds 1 (docs/method.md §4.3). They are drawn as grouped,
    not stacked, bars for that reason; the black tick is the sum of the three (1 up to rounding).

    >>> from geolens.sinks import token_type_decomposition
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> view = decomposition_bars(token_type_decomposition(model, tiny_tokens(model, length=16)))
    >>> type(view).__name__, len(view.figure.axes)  # sink and tail
    ('PlotView', 2)
    """
    df = decomposition.layers
    fig = new_figure(figsize=(11, 5.8))
    axes = fig.subplots(2, 1, sharex=True)
    colors = {"attention": "tab:blue", "relnorm": "tab:orange", "cosine": "tab:green"}
    width = 0.27
    sums = {}
    for ax, source in zip(axes, ("sink", "tail")):
        d = df[df.source == source]
        x = d["layer"].to_numpy()
        total = np.zeros(len(d))
        for k, (f, c) in enumerate(colors.items()):
            v = d[f"share_{f}"].to_numpy()
            ax.bar(x + (k - 1) * width, v, width, color=c, label={"relnorm": "relative norm"}.get(f, f))
            total = total + v
        ax.scatter(x, total, marker="_", s=120, color="k", zorder=3, label="sum of the three")
        sums[source] = total
        ax.axhline(0, color="k", lw=0.6)
        ax.axhline(1, color="k", lw=0.4, ls=":")
        ax.set_ylabel("Cov(X, F) / Var X")
        ax.set_title(
            f"{source} sources: signed share of Var(log|c_ij|) per factor F (shares add up to 1; "
            "a negative share cancels part of the others)",
            fontsize=9,
        )
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    axes[-1].set_xlabel("layer")
    fig.tight_layout()
    return PlotView(
        fig, title="token-type decomposition: signed variance shares", data={"layers": df, "sum_of_shares": sums}
    )


def norm_curve_plot(norm_curve, layers=None, *, scope: str = "layer", max_panels: int = 12) -> PlotView:
    """Mean ‖o_i^h‖ per sink-rate bin (95% CI) with the quadratic fit, one panel per layer.

    >>> from geolens.sinks import output_norm_curve
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers
    >>> view = norm_curve_plot(output_norm_curve(model, tiny_tokens(model, length=16), min_count=1))
    >>> type(view).__name__, len(view.figure.axes)
    ('PlotView', 2)
    """
    curves, fits = norm_curve.curves, norm_curve.fits
    curves = curves[curves.scope == scope]
    fits = fits[fits.scope == scope]
    all_layers = sorted(curves.layer.unique())
    if layers is None:
        layers = (
            all_layers
            if len(all_layers) <= max_panels
            else [all_layers[int(i)] for i in np.linspace(0, len(all_layers) - 1, max_panels)]
        )
    n = len(layers)
    cols = min(4, n)
    rows = int(np.ceil(n / cols))
    fig = new_figure(figsize=(3.2 * cols, 2.6 * rows))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, l in zip(axes, layers):
        c = curves[(curves.layer == l) & (curves["count"] >= norm_curve.min_count)]
        ax.errorbar(
            c.sink_rate, c.mean_norm, yerr=[c.mean_norm - c.ci_lo, c.ci_hi - c.mean_norm], fmt="o", ms=3, capsize=2
        )
        f = fits[fits.layer == l].iloc[0]
        if np.isfinite(f.curvature):
            xs = np.linspace(f.rate_lo, f.rate_hi, 50)
            ax.plot(xs, f.curvature * xs**2 + f.slope * xs + f.intercept, "r-", lw=1)
            if f.convex and np.isfinite(f["argmin"]):
                ax.axvline(f["argmin"], color="r", ls=":", lw=0.8)
        ax.set_title(
            f"layer {l}: a={f.curvature:.2g}" + (f", argmin={f['argmin']:.2f}" if f.convex else ""), fontsize=8
        )
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=7)
    for ax in axes[n:]:
        ax.axis("off")
    fig.supxlabel("sink rate α_i0 (bin centre)")
    fig.supylabel("mean ‖o_i^h‖")
    fig.tight_layout()
    return PlotView(
        fig,
        title="output norm vs sink rate",
        data={"curves": curves[curves.layer.isin(layers)], "fits": fits[fits.layer.isin(layers)]},
    )


def drift_title(drift) -> str:
    """What a drift figure shows, in one line: the edited layers and kv heads, the λ grid, the
    number of sequences (singular or plural) and the low-norm rule.

    >>> from types import SimpleNamespace
    >>> d = SimpleNamespace(edited={"layers": [4, 10], "kv_heads": [0, 1, 2]}, lambdas=(0.0, 1.0), n_sequences=1,
    ...                     low_norm_quantile=0.25)
    >>> drift_title(d)
    'Semantic drift: v_0 ← λ·v_0 in layers 4, 10 (kv heads 0, 1, 2), λ ∈ {0, 1}; 1 sequence; low-norm heads: bottom 25% of relative output norm at λ = 1'
    """
    layers = list(drift.edited.get("layers", []))
    kv = list(drift.edited.get("kv_heads", []))
    unit = "layer" if len(layers) == 1 else "layers"
    n = int(drift.n_sequences)
    return (
        f"Semantic drift: v_0 ← λ·v_0 in {unit} {', '.join(map(str, layers))} (kv heads {', '.join(map(str, kv))}), "
        f"λ ∈ {{{', '.join(f'{x:g}' for x in drift.lambdas)}}}; {n} sequence{'' if n == 1 else 's'}; "
        f"low-norm heads: bottom {drift.low_norm_quantile:.0%} of relative output norm at λ = 1"
    )


def drift_plot(drift) -> PlotView:
    """Three panels against λ: cos(o, cone), relative output norm (low-norm vs other heads), ΔPPL;
    the title names the edited layers, the λ grid and the sample (:func:`drift_title`).

    >>> from geolens.sinks import semantic_drift
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> view = drift_plot(semantic_drift(model, tiny_tokens(model, length=12), lambdas=(0.0,), layers=[1]))
    >>> type(view).__name__, len(view.figure.axes)
    ('PlotView', 3)
    """
    heads, s = drift.heads, drift.summary
    fig = new_figure(figsize=(12, 3.6))
    axes = fig.subplots(1, 3)
    for ax, col, title, ylabel in (
        (axes[0], "cos_cone", "cos(o_i^h, semantic cone)", "cosine (−1 … 1)"),
        (axes[1], "relative_out_norm", "‖o_i^h‖ / mean‖ṽ_j‖", "ratio of norms (unitless)"),
    ):
        for (l, h), g in heads.groupby(["layer", "head"]):
            low = bool(g.low_norm.iloc[0])
            ax.plot(g["lambda"], g[col], color="tab:red" if low else "tab:gray", alpha=0.25 if low else 0.08, lw=0.7)
        ax.plot(s["lambda"], s[f"{col}_low_norm"], "o-", color="tab:red", lw=2, label="low-norm heads (mean)")
        ax.plot(s["lambda"], s[f"{col}_other"], "s-", color="k", lw=2, label="other heads (mean)")
        ax.set_xlabel("λ (v_0 ← λ v_0)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[2].plot(s["lambda"], s["delta_ppl"], "o-")
    axes[2].axhline(0, color="k", lw=0.6)
    axes[2].set_xlabel("λ (v_0 ← λ v_0)")
    axes[2].set_ylabel("ΔPPL (perplexity, edited − λ = 1)", fontsize=8)
    axes[2].set_title(f"ΔPPL vs λ = 1 (PPL(1) = {float(s.loc[s['lambda'] == 1.0, 'ppl'].iloc[0]):.2f})", fontsize=9)
    fig.suptitle(drift_title(drift), fontsize=10)
    fig.tight_layout()
    return PlotView(fig, title="semantic drift", data={"summary": s})


def controls_plot(controls) -> PlotView:
    """Four panels of a :class:`geolens.sinks.controls.ControlsResult`, every value with its CI.

    (a) ΔPPL with all layers edited at once; (b) ΔPPL per edited layer (symlog), layers where the
    claim "the sink's norm specifically matters" holds marked ★; (c) head-output norm, edited /
    clean, at the edited layer; (d) change of the cone cosine at the edited layer.
    """
    from geolens.sinks.controls import ALL

    c = controls.conditions
    edits = [e for e in dict.fromkeys(c.edit) if not e.startswith("rotate seed")]
    colors = {e: f"C{i}" for i, e in enumerate(edits)}
    fig = new_figure(figsize=(15, 3.9))
    axes = fig.subplots(1, 4, gridspec_kw={"width_ratios": [0.8, 1.4, 1.2, 1.2]})
    a = c[c.scope == ALL].set_index("edit")
    if len(a):
        ax = axes[0]
        x = np.arange(len(edits))
        ys = np.array([a.loc[e, "delta_ppl"] for e in edits])
        err = np.array(
            [
                [a.loc[e, "delta_ppl"] - a.loc[e, "delta_ppl_lo"], a.loc[e, "delta_ppl_hi"] - a.loc[e, "delta_ppl"]]
                for e in edits
            ]
        ).T
        ax.bar(x, ys, yerr=err, color=[colors[e] for e in edits], capsize=2)
        ax.set_xticks(x, edits, rotation=60, ha="right", fontsize=7)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title("(a) ΔPPL, all layers at once", fontsize=9)
    per = c[c.scope != ALL].copy()
    if len(per):
        per["layer"] = per.scope.astype(int)
        for ax, (col, lo, hi, title) in zip(
            axes[1:],
            (
                ("delta_ppl", "delta_ppl_lo", "delta_ppl_hi", "(b) ΔPPL, one layer at a time"),
                (
                    "out_norm_ratio",
                    "out_norm_ratio_lo",
                    "out_norm_ratio_hi",
                    "(c) ‖o_i^h‖ edited / clean, at that layer",
                ),
                ("delta_cos", "delta_cos_lo", "delta_cos_hi", "(d) Δ cos(o_i^h, cone), at that layer"),
            ),
        ):
            for k, e in enumerate(edits):
                g = per[per.edit == e].sort_values("layer")
                xs = g.layer + (k - len(edits) / 2) * 0.08
                ax.errorbar(
                    xs,
                    g[col],
                    yerr=[g[col] - g[lo], g[hi] - g[col]],
                    fmt="o-",
                    ms=3,
                    lw=0.9,
                    capsize=1.5,
                    color=colors[e],
                    label=e,
                )
            ax.axhline(1.0 if col == "out_norm_ratio" else 0.0, color="k", lw=0.6)
            ax.set_xlabel("edited layer")
            ax.set_title(title, fontsize=9)
        axes[1].set_yscale("symlog", linthresh=0.1)
        holds = controls.scopes[(controls.scopes.scope != ALL) & (controls.scopes.claim == "holds")]
        if len(holds):
            top = per.delta_ppl_hi.max()
            axes[1].plot(holds.scope.astype(int), [top * 1.5] * len(holds), "*", color="k", label="norm claim holds")
    handles, names = (axes[1] if len(per) else axes[0]).get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="center right", fontsize=7, frameon=False)
    fig.suptitle(
        f"Sink-value controls: {counted(controls.n_windows, 'window')} × {counted(controls.seq_len, 'token')}, "
        f"clean PPL {controls.clean_ppl:.2f}; "
        f"{controls.ci:.0%} CIs, bootstrap over windows (n_boot = {controls.n_boot})",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 0.87, 1))
    return PlotView(
        fig, title="sink-value controls", data={"conditions": c, "pairs": controls.pairs, "scopes": controls.scopes}
    )
