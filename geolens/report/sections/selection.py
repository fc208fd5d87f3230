"""Report section: token-selection geometry, top-N vs random (docs/method.md §5, Mudarisov et al. 2026).

The selection pipeline (:func:`geolens.pipelines.selection.run_selection`) without the regime
fit: :class:`geolens.selection.analysis.SelectionAnalysis` (the authors' protocol: final query of
each window, all layers × query heads, N ∈ {1, 2, 4, …}, random rankings nested across N,
document-bootstrap CIs) runs in the report's shared corpus pass. Quick mode scores the two
cosine-distance value-space conditions (sink kept, sink excluded) with 4 random rankings and 200
bootstrap samples; the full report scores all default conditions with 16 rankings and 2000 samples.
"""

from __future__ import annotations

from geolens.claims import counted
from geolens.pipelines.selection import MAIN, NO_SINK, SelectionParams, run_selection, selection_analyses
from geolens.report.document import Finding, Section
from geolens.selection.analysis import DEFAULT_CONDITIONS


def params(ctx) -> SelectionParams:
    if ctx.config.quick:
        conditions = [c for c in DEFAULT_CONDITIONS if c.name in (MAIN, NO_SINK)]
        s = {"conditions": conditions, "n_random": 4, "n_boot": 200}
    else:
        s = {"conditions": list(DEFAULT_CONDITIONS), "n_random": 16, "n_boot": 2000}
    return SelectionParams(
        seed=ctx.config.seed,
        regime=False,
        batch_size=ctx.config.batch_size,
        title="F_N vs N: top-N vs random, with and without the sink",
        **s,
    )


def quick_sample(ctx) -> str:
    """What quick mode samples down here, in a few words (the report's quick-mode line)."""
    return "token selection with and without the sink only, 4 random draws, 200 resamples"


def analyses(ctx) -> dict:
    return selection_analyses(ctx.model, ctx.tokens, params(ctx))


def finding(res: dict) -> list[Finding]:
    """The headline number: top-N minus random F_N of the main condition at its smallest N, with its CI."""
    comp = res["comparison"]
    main = comp[comp.condition == MAIN].sort_values("N")
    if not len(main):
        return []
    r = main.iloc[0]
    return [
        Finding(
            title="Top-N vs random N-sets: separability F_N",
            what=f"F_N of the top-{int(r.N)} set minus a random {int(r.N)}-set (cosine distance, value space, sink kept)",
            value=float(r["diff"]),
            low=float(r.diff_lo),
            high=float(r.diff_hi),
            n=int(res["n_documents"]),
            units="corpus windows",
            figure=0,
        )
    ]


def build(ctx, analyses: dict) -> Section:
    p = params(ctx)
    run = run_selection(ctx.model, ctx.tokens, p, analyses=analyses, progress=ctx.progress)
    res = run.scores
    intro = (
        "A head selects the N sources with the largest attention; the selection is geometrically "
        "separable (Mudarisov et al. 2026) "
        "when the selected contributions y_i = α_i v_i lie closer to their aggregate s_N than "
        "the others (precision P_N, recall R_N, F_N). Scores are for the final query of each window, "
        f"all layers × heads, document means with bootstrap CIs ({counted(res['n_documents'], 'window')}; "
        f"{counted(res['n_random'], 'random ranking')}). The random N-sets with and without the sink use the same random "
        "rankings and differ only when a draw puts the sink among the first N, so their curves nearly coincide."
    )
    return Section(
        key="selection",
        title="Token-selection geometry",
        intro=intro,
        figures=[run.figures["f_vs_n"]()],
        tables=[
            (
                "top-N vs random F_N per condition and N",
                res["comparison"],
                "F_N is unitless in [0, 1]; CIs are document-bootstrap 95% intervals.",
            )
        ],
        numbers={
            k: res[k]
            for k in ("comparison", "scores", "violations", "sink_in_top", "correlations", "sizes", "n_documents")
        },
        claims=run.claims(),
        params={
            "conditions": [c.name for c in p.conditions],
            "queries": res["queries"],
            "n_random": res["n_random"],
            "n_boot": p.n_boot,
        },
        findings=finding(res),
    )
