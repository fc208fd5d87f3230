"""Report section: the Retriever / Mixer / Reset head taxonomy (docs/method.md §6, paper B).

:class:`~geolens.taxonomy.TaxonomyAnalysis` (winner w_i = argmax_j α_ij‖v_j‖ per query; the
head's regime is its largest winner share) runs in the report's shared corpus pass; the grid is
:func:`geolens.viz.taxonomy.regime_grid_plot`.
"""

from __future__ import annotations

from geolens.report.document import Claim, Section
from geolens.taxonomy import REGIMES, TaxonomyAnalysis
from geolens.viz.taxonomy import regime_grid_plot

RETRIEVER_RANGE = (0.058, 0.172)  # paper B as summarised in docs/method.md §6 (unconfirmed)


def analyses(ctx) -> dict:
    return {"taxonomy": TaxonomyAnalysis.for_model(ctx.model)}


def claims_from(tax) -> list[Claim]:
    dist = tax.distribution
    retr = float(dist["Retriever"])
    lo, hi = RETRIEVER_RANGE
    mixer, reset = float(dist["Mixer"]), float(dist["Reset"])
    dominant = "Mixer" if mixer > reset else "Reset" if reset > mixer else "neither"
    return [
        Claim(
            claim=f"Retrievers are a minority of heads ({100 * lo:.1f}–{100 * hi:.1f}%)",
            source="paper B (docs/method.md §6; unconfirmed numbers)",
            measured=f"Retriever {100 * retr:.1f}% of {tax.regimes.size} heads",
            holds=bool(lo <= retr <= hi),
            criterion=f"share within [{100 * lo:.1f}%, {100 * hi:.1f}%]",
            numbers={"retriever_share": retr},
        ),
        Claim(
            claim="Mixer- vs Reset-dominance depends on the architecture (LLaMA-3, Gemma: Mixer; LLaMA-2, Mistral: Reset)",
            source="paper B (docs/method.md §6; unconfirmed)",
            measured=f"Mixer {100 * mixer:.1f}%, Reset {100 * reset:.1f}%: {dominant}-dominated",
            holds=None,
            criterion="no prediction for this model's family is stated",
            numbers={"mixer_share": mixer, "reset_share": reset, "dominant": dominant},
        ),
    ]


def build(ctx, analyses: dict) -> Section:
    tax = analyses["taxonomy"].result()
    name = f"{ctx.config.corpus} ({ctx.tokens.shape[0]} windows)"
    grid = regime_grid_plot({name: tax}, title=f"Head regimes ({tax.space} space)")
    per_layer = tax.per_layer().reset_index()
    intro = (
        "For each head and query i, the winner is argmax_j α_ij‖v_j‖ over the keys i can see (its "
        "sliding window in a local layer). A head whose winners are mostly "
        "the sink is a <b>Mixer</b>, mostly the current token a <b>Retriever</b>, mostly other tokens a "
        "<b>Reset</b> head (the largest share decides; no threshold). For the 'other' winners the most "
        "frequent relative offset w_i − i is reported; a head whose single offset wins more than half of "
        "its queries is labelled e.g. <i>Reset (offset −1, 83 %)</i> (a previous-token head, which "
        "\"no single preferred source\" does not describe). The last table re-counts the winners on "
        "prefixes of the same windows: how much the regime shares depend on the window length."
    )
    dist = {r: float(tax.distribution[r]) for r in REGIMES}
    cols = ["layer", "head", "regime", "label", "share_other", "top_offset", "top_offset_share", "top_offset_share_of_other", "n_queries"]
    flagged = tax.table.loc[tax.table.offset_dominant, cols]
    by_length = tax.by_length()
    n_flagged = int(tax.table.offset_dominant.sum())
    return Section(
        key="taxonomy",
        title="Head taxonomy",
        intro=intro,
        figures=[grid],
        tables=[
            ("regime counts per layer", per_layer),
            (f"offset-dominated heads ({n_flagged} of {tax.regimes.size}: one offset wins > 50 % of the head's queries)", flagged),
            ("regime shares on window prefixes (share of heads; mean winner shares)", by_length),
        ],
        numbers={
            "distribution": dist,
            "heads": tax.table,
            "offset_dominated": {"n_heads": n_flagged, "share_of_heads": n_flagged / tax.regimes.size, "labels": flagged["label"].tolist()},
            "by_length": by_length,
        },
        claims=claims_from(tax),
        params={"space": tax.space, "skip_first_query": True, "queries": tax.queries, "prefix_lengths": tax.prefix_lengths},
    )
