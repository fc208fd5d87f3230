"""Report section: sink geometry, token-type decomposition, output norm vs sink rate, semantic drift.

The sinks pipeline (:func:`geolens.pipelines.sinks.run_sinks`, docs/method.md §4) with the
analyses' default settings: :class:`~geolens.sinks.SinkGeometry`,
:class:`~geolens.sinks.TokenTypeDecomposition` and :class:`~geolens.sinks.NormCurve` run in the
report's shared corpus pass; :func:`~geolens.sinks.semantic_drift` (one forward pass per λ) runs
on the first windows only (1 window and λ ∈ {0, 1} in quick mode, 16 windows and the default λ
grid otherwise).
"""

from __future__ import annotations

from geolens.pipelines.sinks import SinksParams, run_sinks, sinks_analyses
from geolens.report.document import Finding, Section
from geolens.sinks import DEFAULT_LAMBDAS


def params(ctx) -> SinksParams:
    if ctx.config.quick:
        drift = {"drift_sequences": 1, "lambdas": (0.0, 1.0)}
    else:
        drift = {"drift_sequences": min(16, ctx.tokens.shape[0]), "lambdas": tuple(DEFAULT_LAMBDAS)}
    return SinksParams(batch_size=ctx.config.batch_size, **drift)


def quick_sample(ctx) -> str:
    """What quick mode samples down here, in a few words (the report's quick-mode line)."""
    return "the sink value-norm intervention on 1 window at λ = 0 and 1"


def analyses(ctx) -> dict:
    return sinks_analyses(ctx.model, ctx.tokens, params(ctx))


def build(ctx, analyses: dict) -> Section:
    run = run_sinks(ctx.model, ctx.tokens, params(ctx), analyses=analyses, progress=ctx.progress)
    g, d, n, drift = run.geometry, run.decomposition, run.norm_curve, run.drift
    findings = []
    removed = drift.summary[drift.summary["lambda"] == 0.0]
    if len(removed):
        findings.append(
            Finding(
                title="Removing the sink's value in every head",
                what="perplexity change when the sink value of every layer and head is removed (v_0 ← 0 · v_0)",
                value=float(removed["delta_ppl"].iloc[0]),
                low=None,
                high=None,
                n=int(drift.n_sequences),
                units="corpus windows",
                fmt="+.3g",
            )
        )
    intro = (
        "The sink (position 0) takes much of the attention. Its value geometry decides what it "
        "contributes (Cunningham & Muça Cirone 2026; sink heads counted as in Gu et al. 2024): "
        "norm ratios ‖v_0‖/mean‖v_j‖ and cosines cos(ṽ_0, ṽ_j) per head, the variance of "
        "log|c_ij| split into attention, relative-norm and alignment terms for sink and tail sources, "
        "the head output norm per sink-rate bin with a quadratic convexity fit, and the semantic-drift "
        "intervention v_0 ← λ v_0 (all layers and heads at once)."
    )
    return Section(
        key="sinks",
        title="Sink geometry",
        intro=intro,
        figures=[draw() for draw in run.figures.values()],
        tables=[
            (
                "sink geometry per layer (mean over heads)",
                g.layers,
                "Means over the heads of each layer; v: value vectors, ṽ = v W_O: projected values; j > 0: non-sink sources.",
            ),
            (
                "token-type decomposition (mean over heads)",
                d.summary,
                "log|c_ij| = log α_ij + log ‖ṽ_j‖/‖o_i‖ + log |cos(o_i, ṽ_j)|; each share is Cov(term, log|c_ij|)/Var(log|c_ij|), mean over heads.",
            ),
            (
                "semantic drift per λ",
                drift.summary,
                "The sink value of every layer and head scaled by λ; low-norm heads: bottom quantile of relative output norm at λ = 1.",
            ),
        ],
        numbers={
            "gu_sink_rate": g.gu_sink_rate,
            "geometry_heads": g.heads,
            "decomposition_summary": d.summary,
            "norm_curve_summary": n.summary(),
            "norm_curve_fits": n.fits,
            "drift_summary": drift.summary,
            "drift_edited": drift.edited,
        },
        claims=run.claims(),
        params={
            "gu_epsilon": g.eps,
            "drift_sequences": drift.n_sequences,
            "lambdas": list(drift.lambdas),
            "low_norm_quantile": drift.low_norm_quantile,
        },
        findings=findings,
    )
