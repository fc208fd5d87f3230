"""Report section: token-selection geometry, top-N vs random (docs/method.md §5, paper B).

:class:`geolens.selection.analysis.SelectionAnalysis` (the authors' protocol: final query of
each window, all layers × query heads, N ∈ {1, 2, 4, …}, random rankings nested across N,
document-bootstrap CIs) runs in the report's shared corpus pass. Quick mode scores the two
cosine-distance value-space conditions (sink kept, sink excluded) with 4 random rankings and 200
bootstrap samples; the full report scores all default conditions with 16 rankings and 2000 samples.
"""

from __future__ import annotations

import numpy as np

from geolens.report.document import Claim, Section
from geolens.selection.analysis import DEFAULT_CONDITIONS, SelectionAnalysis
from geolens.viz.selection import f_vs_n_plot

MAIN = "value/cosine/attention/sink-keep"  # cosine: Euclidean F_1 = 1 for any rule (docs/method.md §5)
NO_SINK = "value/cosine/attention/sink-exclude"


def _settings(ctx) -> dict:
    if ctx.config.quick:
        conditions = [c for c in DEFAULT_CONDITIONS if c.name in (MAIN, NO_SINK)]
        return {"conditions": conditions, "n_random": 4, "n_boot": 200}
    return {"conditions": list(DEFAULT_CONDITIONS), "n_random": 16, "n_boot": 2000}


def analyses(ctx) -> dict:
    s = _settings(ctx)
    a = SelectionAnalysis.for_model(
        ctx.model, ctx.tokens.shape[1], conditions=s["conditions"], n_random=s["n_random"], seed=ctx.config.seed
    )
    return {"selection": a}


def claims_from(res: dict) -> list[Claim]:
    comp = res["comparison"]
    main = comp[comp.condition == MAIN].sort_values("N")
    few = main[main.N <= 4]
    beats = bool((few.diff_lo > 0).all()) if len(few) else False
    best_n = int(main.loc[main["diff"].idxmax(), "N"])
    claims = [
        Claim(
            claim="Top-N sets are more separable than random N-subsets",
            source="paper B",
            measured="F_N top − random (cosine, value space): " + ", ".join(f"N={int(r.N)} {r['diff']:+.3f} [{r.diff_lo:+.3f}, {r.diff_hi:+.3f}]" for _, r in few.iterrows()),
            holds=beats,
            criterion="95% CI of the difference above 0 for every N ≤ 4",
            numbers={"comparison": main},
        ),
        Claim(
            claim="The separation advantage is largest for few tokens (N ≈ 1–4)",
            source="paper B",
            measured=f"largest top − random F_N difference at N = {best_n}",
            holds=bool(best_n <= 4),
            criterion="argmax over N of the difference ≤ 4",
            numbers={"best_n": best_n},
        ),
    ]
    corr = res["correlations"].set_index("N")
    n_c = 4 if 4 in corr.index else int(corr.index[0])
    r = float(corr.loc[n_c, "pooled_r_sink_alignment_recall"])
    if np.isfinite(r):
        claims.append(
            Claim(
                claim="Sink similarity correlates with recall",
                source="paper B",
                measured=f"pooled Pearson r(mean cos(u_0, u_j), R_N) = {r:+.3f} at N = {n_c} (across heads Spearman {float(corr.loc[n_c, 'across_heads_spearman']):+.3f})",
                holds=bool(abs(r) >= 0.1),
                criterion="|r| ≥ 0.1",
                numbers={"N": n_c, "pooled_r": r},
            )
        )
    scores = res["scores"]
    f = scores[(scores.metric == "f") & (scores.kind == "top") & (scores.N == n_c)].set_index("condition")["mean"]
    if MAIN in f.index and NO_SINK in f.index:
        keep, excl = float(f[MAIN]), float(f[NO_SINK])
        claims.append(
            Claim(
                claim="F_N is about 2× lower when the sink is in the candidate set",
                source="French summary of paper B (docs/method.md §5; unverified)",
                measured=f"top-{n_c} F_N (cosine): with sink {keep:.3f}, without {excl:.3f} (ratio {keep / excl:.2f})" if excl else f"without sink F_N = 0",
                holds=bool(excl > 0 and keep <= 0.5 * excl),
                criterion="F_N with sink ≤ half of F_N without",
                numbers={"N": n_c, "with_sink": keep, "without_sink": excl},
            )
        )
    return claims


def build(ctx, analyses: dict) -> Section:
    s = _settings(ctx)
    res = analyses["selection"].result(n_boot=s["n_boot"], seed=ctx.config.seed)
    figs = [f_vs_n_plot(res["scores"], space="value", by="attention", title="F_N vs N: top-N vs random, with and without the sink")]
    comp = res["comparison"]
    intro = (
        "A head selects the N sources with the largest attention; the selection is geometrically "
        "separable when the selected contributions y_i = α_i v_i lie closer to their aggregate s_N than "
        "the others (precision P_N, recall R_N, F_N). Scores are for the final query of each window, "
        f"all layers × heads, document means with bootstrap CIs ({res['n_documents']} windows; "
        f"{res['n_random']} random rankings)."
    )
    return Section(
        key="selection",
        title="Token-selection geometry",
        intro=intro,
        figures=figs,
        tables=[("top-N vs random F_N per condition and N", comp)],
        numbers={k: res[k] for k in ("comparison", "scores", "violations", "sink_in_top", "correlations", "sizes", "n_documents")},
        claims=claims_from(res),
        params={"conditions": [c.name for c in s["conditions"]], "queries": res["queries"], "n_random": res["n_random"], "n_boot": s["n_boot"]},
    )
