"""The head-taxonomy pipeline (docs/method.md §6, Mudarisov et al. 2026): Retriever / Mixer /
Reset regimes.

:class:`~geolens.taxonomy.TaxonomyAnalysis` counts, per head, the winners w_i =
argmax_j α_ij‖v_j‖ over the keys each query sees (sink / current / other); the regime is the
largest share. The tables: the per-head table (with the most frequent relative offset of the
"other" winners and the label of offset-dominated heads), the head count per regime and layer,
the top offsets per head and the regime shares on window prefixes. ``geolens taxonomy`` runs it
once per corpus (and compares the first two); the report's taxonomy section runs it in the shared
corpus pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Sequence

from geolens.claims import Claim
from geolens.pipelines import TopicRun, streamed
from geolens.taxonomy import DEFAULT_PREFIX_LENGTHS, TaxonomyAnalysis

RETRIEVER_RANGE = (0.058, 0.172)  # Mudarisov et al. 2026 as summarised in docs/method.md §6 (unconfirmed)


@dataclass
class TaxonomyParams:
    """Parameters of :func:`run_taxonomy` (the defaults are the analysis' own)."""

    space: str = "value"  # ‖v‖ (Mudarisov et al. 2026) or ‖v W_O‖ ("projected")
    queries: str = "all"  # every query ≥ 1, or the final query of each window
    prefix_lengths: Sequence[int] = DEFAULT_PREFIX_LENGTHS
    batch_size: int = 8
    label: str = ""  # the corpus, in the regime grid
    title: str = ""  # title of the regime grid


def taxonomy_analyses(model, tokens, params: TaxonomyParams) -> dict:
    """The corpus analysis of the taxonomy pipeline (one pass over ``tokens``)."""
    return {
        "taxonomy": TaxonomyAnalysis.for_model(
            model, space=params.space, queries=params.queries, prefix_lengths=params.prefix_lengths
        )
    }


@dataclass(kw_only=True)
class TaxonomyRun(TopicRun):
    """:func:`run_taxonomy`'s result: ``taxonomy`` is the :class:`~geolens.taxonomy.TaxonomyResult`."""

    taxonomy: object

    @property
    def figures(self) -> dict:
        from geolens.viz.taxonomy import regime_grid_plot

        return {
            "regime_grid": partial(
                regime_grid_plot, {self.parameters["label"]: self.taxonomy}, title=self.parameters["title"]
            )
        }

    def claims(self) -> list:
        return taxonomy_claims(self.taxonomy)


def run_taxonomy(
    model,
    tokens,
    params: TaxonomyParams = TaxonomyParams(),
    *,
    analyses: dict | None = None,
    progress: bool = True,
    desc: str = "taxonomy",
) -> TaxonomyRun:
    """The taxonomy pipeline over the windows ``tokens`` ``[n, seq]`` (BOS first, unpadded).

    ``analyses``: :func:`taxonomy_analyses` already run over ``tokens`` (then no corpus pass here).
    """
    analyses = streamed(
        model,
        tokens,
        analyses,
        lambda: taxonomy_analyses(model, tokens, params),
        batch_size=params.batch_size,
        progress=progress,
        desc=desc,
    )
    tax = analyses["taxonomy"].result()
    tables = {
        "heads": tax.table,
        "per_layer": tax.per_layer(),
        "offsets": tax.offset_table(),
        "by_length": tax.by_length(),
    }
    return TaxonomyRun(parameters=asdict(params), tables=tables, taxonomy=tax)


def taxonomy_claims(tax) -> list:
    """The claims of Mudarisov et al. 2026 on the regime shares, decided from a
    :class:`~geolens.taxonomy.TaxonomyResult`."""
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
