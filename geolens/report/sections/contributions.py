"""Report section: contribution weights vs attention (docs/method.md §2;
Cunningham & Muça Cirone 2026 §2.2, §3.2).

Corpus statistics from :class:`~geolens.report.contrast.ContributionContrast` (sink attention vs
sink contribution, top-1 agreement, share of negative contributions, per layer and head), the
per-layer sink plot, and example circuitsvis views on the report's prompt: per-head heatmaps of
α and c (signed) for the layer where attention and contribution disagree most (or the configured
``example_layer``), and the final query's sources coloured by both.
"""

from __future__ import annotations

import torch

from geolens.adapter import names_filter
from geolens.claims import Claim, counted
from geolens.report.contrast import ContributionContrast
from geolens.report.document import Finding, Section
from geolens.viz.contributions import contribution_heatmaps, sink_attention_vs_contribution_plot, source_colors


def analyses(ctx) -> dict:
    return {"contrast": ContributionContrast.for_model(ctx.model)}


def build(ctx, analyses: dict) -> Section:
    model, cfg = ctx.model, ctx.config
    contrast = analyses["contrast"]
    per_head, per_layer, overall = contrast.per_head(), contrast.per_layer(), contrast.overall()
    n_queries = int(contrast.sink_attention.count.sum())

    n_layers = model.cfg.n_layers
    if cfg.example_layer is not None:
        layer = cfg.example_layer % n_layers
    else:
        layer = int(per_layer["top1_agreement"].idxmin())  # where α and c disagree most
    prompt = ctx.prompt_tokens
    with torch.no_grad():
        _, cache = model.run_with_cache(prompt, names_filter=names_filter(model))
    heat = contribution_heatmaps(model, cache, prompt, layer, mode="intra")
    colors = source_colors(model, cache, prompt, layer, query=-1)
    plot = sink_attention_vs_contribution_plot(
        torch.tensor(per_layer["sink_attention"].to_numpy()), torch.tensor(per_layer["sink_contribution"].to_numpy())
    )

    a0, c0 = overall["sink_attention"], overall["sink_contribution"]
    agree, neg = overall["top1_agreement"], overall["negative_share"]
    scope = f"{counted(n_layers, 'layer')} × {counted(model.cfg.n_heads, 'head')}, {counted(n_queries, '(head, query) sample')}"
    claims = [
        Claim(
            claim="Attention to the sink overstates what the sink contributes to the head output",
            source="paper A §3.2",
            measured=f"mean α_i0 = {a0:.3f} vs mean intra-head c_i0 = {c0:.3f} ({scope})",
            holds=bool(c0 < a0),
            criterion="mean c_i0 < mean α_i0 over all heads and queries",
            numbers={"mean_sink_attention": a0, "mean_sink_contribution": c0},
        ),
        Claim(
            claim="Contribution weights can be negative (destructive interference)",
            source="paper A §2.2",
            measured=f"{100 * neg:.1f}% of visible (query, source) pairs have c_ij < 0 (mean over heads and queries)",
            holds=bool(neg > 0),
            criterion="share of c_ij < 0 is above 0",
            numbers={"negative_share": neg},
        ),
        Claim(
            claim="Attention weights and contribution weights rank sources differently",
            source="paper A §2.2–3.1",
            measured=f"the top source by α is the top source by c for {100 * agree:.1f}% of queries",
            holds=None,
            criterion="none given by the paper (reported as measured)",
            numbers={"top1_agreement": agree},
        ),
    ]
    intro = (
        "Attention α_ij says where a head looks; the contribution weight c_ij = ⟨o_i, α_ij ṽ_j⟩/‖o_i‖² "
        "(Cunningham & Muça Cirone 2026) says how much of the head output o_i source j provides (it can be negative). Corpus "
        f"statistics over {counted(ctx.tokens.shape[0], 'window')} of {counted(ctx.tokens.shape[1], 'token')}; the example "
        f"heatmaps show layer {layer} "
        + ("(chosen)" if cfg.example_layer is not None else "(the layer with the lowest top-1 agreement)")
        + " on the prompt (click a head to enlarge it). Attention is blue; contribution weights are blue "
        "where positive and red where negative, each sign on its own scale (stated under the heatmap), "
        "because negative weights are usually far smaller than the positive ones."
    )
    layer_table = per_layer.copy()
    return Section(
        key="contributions",
        title="Contribution vs attention",
        intro=intro,
        figures=[plot, heat, colors],
        tables=[
            (
                "per layer (head means)",
                layer_table,
                "Means over the heads of each layer, over all queries i ≥ 1 of the corpus windows.",
            )
        ],
        numbers={"overall": overall, "per_head": per_head, "example_layer": layer, "n_samples": n_queries},
        claims=claims,
        params={"mode": "intra", "example_layer": layer, "prompt": cfg.prompt},
        findings=[
            Finding(
                title="Sink attention minus sink contribution",
                what=f"mean attention to the sink α_i0 = {a0:.3f} minus mean sink contribution c_i0 = {c0:.3f} "
                "(means over all heads and queries; figure: per layer)",
                value=a0 - c0,
                low=None,
                high=None,
                n=int(ctx.tokens.shape[0]),
                units="corpus windows",
                figure=0,
            )
        ],
    )
