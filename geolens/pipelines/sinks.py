"""The sinks pipeline (docs/method.md §4): sink geometry, token-type decomposition and output-norm
curve in one corpus pass, then the semantic-drift experiment on the first windows.

``geolens sinks`` runs it with the command's options and writes its tables and figures; the
report's sinks section runs it with report-sized parameters (its corpus pass shared with the
other sections) and shows it. The sink-intervention controls (``geolens sinks
--controls-sequences``) are one call of :func:`geolens.sinks.sink_controls`, made by the command.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Sequence

import numpy as np

from geolens.claims import Claim, sample_size
from geolens.pipelines import TopicRun, streamed
from geolens.sinks import DEFAULT_LAMBDAS, GU_EPSILON, NormCurve, SinkGeometry, TokenTypeDecomposition, semantic_drift


@dataclass
class SinksParams:
    """Parameters of :func:`run_sinks` (the defaults are the analyses' own)."""

    eps: float = GU_EPSILON  # Gu et al. threshold on the mean first-token attention
    n_bins: int = 20  # sink-rate bins on [0, 1] (sink-rate histogram and norm curve)
    min_count: int = 20  # queries a bin needs to enter the norm curve's quadratic fit
    decomposition_sequences: int | None = None  # the decomposition uses only the first N windows (None: all)
    drift_sequences: int = 48  # first N windows of the semantic-drift experiment (0: skip it)
    lambdas: Sequence[float] = DEFAULT_LAMBDAS
    drift_layers: Sequence[int] | None = None  # layers whose v_0 is scaled (None: all)
    drift_kv_heads: Sequence[int] | None = None  # kv heads whose v_0 is scaled (None: all)
    low_norm_quantile: float = 0.25
    batch_size: int = 8


def sinks_analyses(model, tokens, params: SinksParams) -> dict:
    """The corpus analyses of the sinks pipeline (one pass over ``tokens``)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    return {
        "geometry": SinkGeometry(L, H, eps=params.eps, n_bins=params.n_bins),
        "decomposition": TokenTypeDecomposition(L, H, max_sequences=params.decomposition_sequences),
        "norm_curve": NormCurve(L, H, n_bins=params.n_bins),
    }


@dataclass(kw_only=True)
class SinksRun(TopicRun):
    """:func:`run_sinks`'s result: the four result objects of :mod:`geolens.sinks` (``drift`` is
    None when ``drift_sequences`` is 0), their tables, figures and claims."""

    geometry: object
    decomposition: object
    norm_curve: object
    drift: object | None = None

    @property
    def figures(self) -> dict:
        from geolens.viz.sinks import decomposition_bars, drift_plot, norm_curve_plot, sink_layer_bars

        out = {
            "sink_layers": partial(sink_layer_bars, self.geometry),
            "decomposition": partial(decomposition_bars, self.decomposition),
            "norm_curve_layers": partial(norm_curve_plot, self.norm_curve),
        }
        if self.drift is not None:
            out["drift"] = partial(drift_plot, self.drift)
        return out

    def claims(self) -> list:
        return sink_claims(self.geometry, self.decomposition, self.norm_curve.summary(), self.drift)


def run_sinks(
    model,
    tokens,
    params: SinksParams = SinksParams(),
    *,
    analyses: dict | None = None,
    progress: bool = True,
    desc: str = "sinks: corpus pass",
) -> SinksRun:
    """The sinks pipeline over the windows ``tokens`` ``[n, seq]`` (BOS first, unpadded).

    ``analyses``: :func:`sinks_analyses` already run over ``tokens`` (then no corpus pass here).
    """
    analyses = streamed(
        model,
        tokens,
        analyses,
        lambda: sinks_analyses(model, tokens, params),
        batch_size=params.batch_size,
        progress=progress,
        desc=desc,
    )
    g, d = analyses["geometry"].result(), analyses["decomposition"].result()
    n = analyses["norm_curve"].result(min_count=params.min_count)
    tables = {
        "geometry_heads": g.heads,
        "geometry_layers": g.layers,
        "sink_rate_hist": g.sink_rate_hist,
        "decomposition_heads": d.heads,
        "decomposition_layers": d.layers,
        "decomposition_summary": d.summary,
        "norm_curves": n.curves,
        "norm_fits": n.fits,
    }
    drift = None
    if params.drift_sequences > 0:
        drift = semantic_drift(
            model,
            tokens[: params.drift_sequences],
            lambdas=params.lambdas,
            layers=params.drift_layers,
            kv_heads=params.drift_kv_heads,
            low_norm_quantile=params.low_norm_quantile,
            batch_size=params.batch_size,
            progress=progress,
        )
        tables.update(drift_heads=drift.heads, drift_summary=drift.summary)
    return SinksRun(parameters=asdict(params), tables=tables, geometry=g, decomposition=d, norm_curve=n, drift=drift)


def sink_claims(geometry, decomposition, norm_summary: dict, drift) -> list:
    """The sink claims of docs/method.md §4, each decided from this run's numbers."""
    h = geometry.heads
    value_ratio, proj_ratio = float(h.value_norm_ratio.median()), float(h.proj_norm_ratio.median())
    cos_mean = float(h.proj_cos_tail.mean())
    cos_neg = float((h.proj_cos_tail < 0).mean())
    s = decomposition.summary.set_index("source")
    sink_att, sink_geo = (
        float(s.loc["sink", "share_attention"]),
        float(s.loc["sink", "share_relnorm"] + s.loc["sink", "share_cosine"]),
    )
    tail_att_cos, tail_rel = (
        float(s.loc["tail", "share_attention"] + s.loc["tail", "share_cosine"]),
        float(s.loc["tail", "share_relnorm"]),
    )
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
            measured=f"share of Var(log|c|): sink attention {sink_att:.2f} vs norm+cosine {sink_geo:.2f}; "
            f"tail attention+cosine {tail_att_cos:.2f} vs norm {tail_rel:.2f}",
            holds=bool(sink_att < sink_geo and tail_att_cos > tail_rel),
            criterion="sink: attention share < norm+cosine; tail: attention+cosine > norm",
            numbers={
                "sink_share_attention": sink_att,
                "sink_share_geometry": sink_geo,
                "tail_share_attention_cosine": tail_att_cos,
                "tail_share_relnorm": tail_rel,
            },
        ),
        Claim(
            claim="Head output norm vs sink rate is convex with its minimum at an intermediate sink rate",
            source="paper A §3.3",
            measured=f"{100 * inside:.0f}% of {norm_summary['head_n_fitted']} fitted head curves are convex with argmin in (0, 1)"
            if np.isfinite(inside)
            else "no head had enough queries per bin for a fit",
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
                measured=f"λ = {lo:g}: ΔPPL = {dppl:+.3f}; cos(o, cone) of low-norm heads {cos_1:+.3f} (λ=1) → {cos_lo:+.3f} "
                f"({drift.n_sequences} windows)",
                holds=bool(dppl > 0 and cos_lo > cos_1),
                criterion="ΔPPL(λ_min) > 0 and low-norm heads' cosine with the cone rises",
                numbers={
                    "lambda": lo,
                    "delta_ppl": dppl,
                    "cos_cone_low_norm_lambda_min": cos_lo,
                    "cos_cone_low_norm_lambda_1": cos_1,
                    "sample": sample_size(drift.n_sequences),
                },
            )
        )
    return claims
