"""Report section: the Retriever / Mixer / Reset head taxonomy (docs/method.md §6, Mudarisov et al. 2026).

The taxonomy pipeline (:func:`geolens.pipelines.taxonomy.run_taxonomy`) with the analysis'
default settings: :class:`~geolens.taxonomy.TaxonomyAnalysis` (winner w_i = argmax_j α_ij‖v_j‖
per query; the head's regime is its largest winner share) runs in the report's shared corpus
pass; the grid is :func:`geolens.viz.taxonomy.regime_grid_plot`.
"""

from __future__ import annotations

from geolens.claims import counted
from geolens.pipelines.taxonomy import TaxonomyParams, run_taxonomy, taxonomy_analyses
from geolens.report.document import Finding, Section
from geolens.taxonomy import REGIMES


def params(ctx) -> TaxonomyParams:
    p = TaxonomyParams(
        batch_size=ctx.config.batch_size, label=f"{ctx.config.corpus} ({counted(ctx.tokens.shape[0], 'window')})"
    )
    p.title = f"Head regimes ({p.space} space)"
    return p


def analyses(ctx) -> dict:
    return taxonomy_analyses(ctx.model, ctx.tokens, params(ctx))


def build(ctx, analyses: dict) -> Section:
    run = run_taxonomy(ctx.model, ctx.tokens, params(ctx), analyses=analyses, progress=ctx.progress)
    tax = run.taxonomy
    per_layer = run.tables["per_layer"].reset_index()
    intro = (
        "Head regimes as defined by Mudarisov et al. 2026. "
        "For each head and query i, the winner is argmax_j α_ij‖v_j‖ over the keys i can see (its "
        "sliding window in a local layer). A head whose winners are mostly "
        "the sink is a <b>Mixer</b>, mostly the current token a <b>Retriever</b>, mostly other tokens a "
        "<b>Reset</b> head (the largest share decides; no threshold). For the 'other' winners the most "
        "frequent relative offset w_i − i is reported; a head whose single offset wins more than half of "
        "its queries is labelled e.g. <i>Reset (offset −1, 83 %)</i> (a previous-token head, which "
        '"no single preferred source" does not describe). The last table re-counts the winners on '
        "prefixes of the same windows: how much the regime shares depend on the window length."
    )
    dist = {r: float(tax.distribution[r]) for r in REGIMES}
    cols = [
        "layer",
        "head",
        "regime",
        "label",
        "share_other",
        "top_offset",
        "top_offset_share",
        "top_offset_share_of_other",
        "n_queries",
    ]
    flagged = tax.table.loc[tax.table.offset_dominant, cols]
    by_length = run.tables["by_length"]
    n_flagged = int(tax.table.offset_dominant.sum())
    return Section(
        key="taxonomy",
        title="Head taxonomy",
        intro=intro,
        figures=[run.figures["regime_grid"]()],
        tables=[
            ("regime counts per layer", per_layer, "Counts of heads per layer in each regime."),
            (
                f"offset-dominated heads ({n_flagged} of {tax.regimes.size}: one offset wins > 50 % of the head's queries)",
                flagged,
                "Shares are of the head's counted queries unless stated.",
            ),
            (
                "regime shares on window prefixes (share of heads; mean winner shares)",
                by_length,
                "Mixer, Retriever, Reset: share of heads in each regime on the prefixes.",
            ),
        ],
        numbers={
            "distribution": dist,
            "heads": tax.table,
            "offset_dominated": {
                "n_heads": n_flagged,
                "share_of_heads": n_flagged / tax.regimes.size,
                "labels": flagged["label"].tolist(),
            },
            "by_length": by_length,
        },
        claims=run.claims(),
        params={
            "space": tax.space,
            "skip_first_query": True,
            "queries": tax.queries,
            "prefix_lengths": tax.prefix_lengths,
        },
        findings=[
            Finding(
                title="Share of Mixer heads",
                what="share of heads whose winners are mostly the sink (Retriever "
                f"{dist['Retriever']:.2f}, Reset {dist['Reset']:.2f})",
                value=dist["Mixer"],
                low=None,
                high=None,
                n=int(tax.regimes.size),
                units=f"heads, {ctx.tokens.shape[0]} corpus windows",
                fmt=".2f",
                figure=0,
            )
        ],
    )
