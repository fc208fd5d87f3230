"""Report section: sink geometry, token-type decomposition, output norm vs sink rate, semantic drift.

Uses :mod:`geolens.sinks` (docs/method.md §4): :class:`~geolens.sinks.SinkGeometry`,
:class:`~geolens.sinks.TokenTypeDecomposition` and :class:`~geolens.sinks.NormCurve` run in the
report's shared corpus pass; :func:`~geolens.sinks.semantic_drift` (one forward pass per λ) runs
on the first windows only (1 window and λ ∈ {0, 1} in quick mode, 16 windows and the default λ
grid otherwise). Figures come from :mod:`geolens.viz.sinks`.
"""

from __future__ import annotations

import numpy as np

from geolens.report.build import sample_size
from geolens.report.document import Claim, Section
from geolens.sinks import DEFAULT_LAMBDAS, NormCurve, SinkGeometry, TokenTypeDecomposition, semantic_drift
from geolens.viz.sinks import decomposition_bars, drift_plot, norm_curve_plot, sink_layer_bars


def analyses(ctx) -> dict:
    L, H = ctx.model.cfg.n_layers, ctx.model.cfg.n_heads
    return {"geometry": SinkGeometry(L, H), "decomposition": TokenTypeDecomposition(L, H), "norm_curve": NormCurve(L, H)}


def drift_settings(ctx) -> dict:
    n = ctx.tokens.shape[0]
    if ctx.config.quick:
        return {"n_sequences": 1, "lambdas": (0.0, 1.0)}
    return {"n_sequences": min(16, n), "lambdas": tuple(DEFAULT_LAMBDAS)}


def claims_from(geometry, decomposition, norm_summary: dict, drift) -> list[Claim]:
    """The sink claims of docs/method.md §4, each decided from this run's numbers."""
    h = geometry.heads
    value_ratio, proj_ratio = float(h.value_norm_ratio.median()), float(h.proj_norm_ratio.median())
    cos_mean = float(h.proj_cos_tail.mean())
    cos_neg = float((h.proj_cos_tail < 0).mean())
    s = decomposition.summary.set_index("source")
    sink_att, sink_geo = float(s.loc["sink", "share_attention"]), float(s.loc["sink", "share_relnorm"] + s.loc["sink", "share_cosine"])
    tail_att_cos, tail_rel = float(s.loc["tail", "share_attention"] + s.loc["tail", "share_cosine"]), float(s.loc["tail", "share_relnorm"])
    inside = norm_summary["head_share_convex_argmin_inside"]
    claims = [
        Claim(
            claim="The sink's value vector is 3–10× smaller than the other tokens' (value space)",
            source="paper B (docs/method.md §4; unconfirmed number)",
            measured=f"median over heads of ‖v_0‖/mean‖v_j‖ = {value_ratio:.3f} (projected ‖ṽ_0‖/mean‖ṽ_j‖ = {proj_ratio:.3f})",
            holds=bool(value_ratio <= 1 / 3),
            criterion="median value-space ratio ≤ 1/3",
            numbers={"value_norm_ratio_median": value_ratio, "proj_norm_ratio_median": proj_ratio},
        ),
        Claim(
            claim="The sink's projected value is anti-aligned with the other tokens': cos(ṽ_0, ṽ_j) < 0",
            source="papers A §3.2 and B",
            measured=f"mean cos(ṽ_0, ṽ_j) = {cos_mean:+.3f}; negative in {100 * cos_neg:.0f}% of heads",
            holds=bool(cos_mean < 0 and cos_neg > 0.5),
            criterion="mean < 0 and negative in most heads",
            numbers={"proj_cos_tail_mean": cos_mean, "share_heads_proj_cos_tail_negative": cos_neg},
        ),
        Claim(
            claim="Sink contributions are governed by value geometry, tail contributions by attention and alignment",
            source="paper A §3.2",
            measured=(
                f"share of Var(log|c|): sink attention {sink_att:.2f} vs norm+cosine {sink_geo:.2f}; "
                f"tail attention+cosine {tail_att_cos:.2f} vs norm {tail_rel:.2f}"
            ),
            holds=bool(sink_att < sink_geo and tail_att_cos > tail_rel),
            criterion="sink: attention share < norm+cosine; tail: attention+cosine > norm",
            numbers={"sink_share_attention": sink_att, "sink_share_geometry": sink_geo, "tail_share_attention_cosine": tail_att_cos, "tail_share_relnorm": tail_rel},
        ),
        Claim(
            claim="Head output norm vs sink rate is convex with its minimum at an intermediate sink rate",
            source="paper A §3.3",
            measured=(
                f"{100 * inside:.0f}% of {norm_summary['head_n_fitted']} fitted head curves are convex with argmin in (0, 1)"
                if np.isfinite(inside) else "no head had enough queries per bin for a fit"
            ),
            holds=bool(inside > 0.5) if np.isfinite(inside) else None,
            criterion="more than half of the fitted head curves",
            numbers={k: v for k, v in norm_summary.items()},
        ),
    ]
    if drift is not None:
        sm = drift.summary.set_index("lambda")
        lo = float(sm.index.min())
        dppl = float(sm.loc[lo, "delta_ppl"])
        cos_lo, cos_1 = float(sm.loc[lo, "cos_cone_low_norm"]), float(sm.loc[1.0, "cos_cone_low_norm"])
        claims.append(
            Claim(
                claim="Removing the sink's value norm collapses low-norm head outputs into the semantic cone and raises perplexity",
                source="paper A §3.3",
                measured=(
                    f"λ = {lo:g}: ΔPPL = {dppl:+.3f}; cos(o, cone) of low-norm heads {cos_1:+.3f} (λ=1) → {cos_lo:+.3f} "
                    f"({drift.n_sequences} windows)"
                ),
                holds=bool(dppl > 0 and cos_lo > cos_1),
                criterion="ΔPPL(λ_min) > 0 and low-norm heads' cosine with the cone rises",
                numbers={"lambda": lo, "delta_ppl": dppl, "cos_cone_low_norm_lambda_min": cos_lo, "cos_cone_low_norm_lambda_1": cos_1,
                         "sample": sample_size(drift.n_sequences)},
            )
        )
    return claims


def build(ctx, analyses: dict) -> Section:
    g = analyses["geometry"].result()
    d = analyses["decomposition"].result()
    n = analyses["norm_curve"].result()
    settings = drift_settings(ctx)
    drift = semantic_drift(
        ctx.model, ctx.tokens[: settings["n_sequences"]], lambdas=settings["lambdas"],
        batch_size=ctx.config.batch_size, progress=ctx.progress,
    )  # fmt: skip
    figures = [sink_layer_bars(g), decomposition_bars(d), norm_curve_plot(n), drift_plot(drift)]
    summary = n.summary()
    intro = (
        "The sink (position 0) takes much of the attention. Its value geometry decides what it "
        "contributes: norm ratios ‖v_0‖/mean‖v_j‖ and cosines cos(ṽ_0, ṽ_j) per head, the variance of "
        "log|c_ij| split into attention, relative-norm and alignment terms for sink and tail sources, "
        "the head output norm per sink-rate bin with a quadratic convexity fit, and the semantic-drift "
        "intervention v_0 ← λ v_0 (all layers and heads at once)."
    )
    return Section(
        key="sinks",
        title="Sink geometry",
        intro=intro,
        figures=figures,
        tables=[("sink geometry per layer (mean over heads)", g.layers), ("token-type decomposition (mean over heads)", d.summary), ("semantic drift per λ", drift.summary)],
        numbers={
            "gu_sink_rate": g.gu_sink_rate,
            "geometry_heads": g.heads,
            "decomposition_summary": d.summary,
            "norm_curve_summary": summary,
            "norm_curve_fits": n.fits,
            "drift_summary": drift.summary,
            "drift_edited": drift.edited,
        },
        claims=claims_from(g, d, summary, drift),
        params={"gu_epsilon": g.eps, "drift_sequences": drift.n_sequences, "lambdas": list(drift.lambdas), "low_norm_quantile": drift.low_norm_quantile},
    )
