"""The token-selection pipeline (docs/method.md §5–6): selection geometry with the authors'
protocol, top-N vs random, and (optionally) the sink-aware regime fit, in one corpus pass.

:class:`geolens.selection.analysis.SelectionAnalysis` scores P_N, R_N, F_N of the final query
(or every query) of each window for all layers × query heads and N ∈ {1, 2, 4, …} below the
visible count (capped by ``max_n``), top-N by attention against ``n_random`` random rankings
nested across N, with document-bootstrap CIs; :class:`geolens.selection.regime.RegimeAnalysis`
fits the regime. ``geolens selection`` runs it once per corpus and writes it (the effective set
size N* is one call of :func:`geolens.selection.effective_set.effective_set_size`, made by the
command); the report's selection section runs it without the regime fit and shows it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Sequence

import numpy as np

from geolens.claims import Claim
from geolens.pipelines import TopicRun, streamed
from geolens.selection.analysis import DEFAULT_CONDITIONS, Condition, SelectionAnalysis
from geolens.selection.regime import RegimeAnalysis

MAIN = "value/cosine/attention/sink-keep"  # cosine: Euclidean F_1 = 1 for any rule (docs/method.md §5)
NO_SINK = "value/cosine/attention/sink-exclude"
TABLES = ("comparison", "scores", "by_layer", "violations", "sink_in_top", "heads", "correlations")


@dataclass
class SelectionParams:
    """Parameters of :func:`run_selection` (the defaults are the analysis' own)."""

    max_n: int = 256  # largest N of {1, 2, 4, …} (always below the visible count)
    n_random: int = 16
    queries: str = "final"
    seed: int = 0
    conditions: Sequence[Condition] = DEFAULT_CONDITIONS
    n_boot: int = 2000
    regime: bool = True  # also fit the sink-aware regime (RegimeAnalysis)
    batch_size: int = 8
    label: str = ""  # the corpus, in figure titles
    title: str = ""  # title of the F_N-vs-N figure


def selection_analyses(model, tokens, params: SelectionParams) -> dict:
    """The corpus analyses of the selection pipeline (one pass over ``tokens``)."""
    seq_len = int(tokens.shape[1])
    out = {
        "selection": SelectionAnalysis.for_model(
            model,
            seq_len,
            max_n=params.max_n,
            conditions=params.conditions,
            n_random=params.n_random,
            queries=params.queries,
            seed=params.seed,
        )
    }
    if params.regime:
        out["regime"] = RegimeAnalysis.for_model(model, seq_len)
    return out


@dataclass(kw_only=True)
class SelectionRun(TopicRun):
    """:func:`run_selection`'s result: ``scores`` is :meth:`SelectionAnalysis.result`'s dict,
    ``regime`` :meth:`RegimeAnalysis.result`'s (None without the regime fit)."""

    scores: dict
    regime: dict | None = None

    @property
    def figures(self) -> dict:
        from geolens.viz.selection import f_by_layer_plot, f_vs_n_plot, similarity_decay_plot

        res, label = self.scores, self.parameters["label"]
        out = {
            "f_vs_n": partial(
                f_vs_n_plot, res["scores"], space="value", by="attention", title=self.parameters["title"]
            ),
            "f_by_layer": partial(
                f_by_layer_plot, res["by_layer"], res["main_condition"], title=f"{label}: {res['main_condition']}"
            ),
        }
        if self.regime is not None:
            out["similarity_decay"] = partial(similarity_decay_plot, self.regime["lag_sim"], self.regime["heads"])
        return out

    def claims(self) -> list:
        return selection_claims(self.scores)


def run_selection(
    model,
    tokens,
    params: SelectionParams = SelectionParams(),
    *,
    analyses: dict | None = None,
    progress: bool = True,
    desc: str = "selection",
) -> SelectionRun:
    """The selection pipeline over the windows ``tokens`` ``[n, seq]`` (BOS first, unpadded).

    ``analyses``: :func:`selection_analyses` already run over ``tokens`` (then no corpus pass here).
    """
    analyses = streamed(
        model,
        tokens,
        analyses,
        lambda: selection_analyses(model, tokens, params),
        batch_size=params.batch_size,
        progress=progress,
        desc=desc,
    )
    res = analyses["selection"].result(n_boot=params.n_boot, seed=params.seed)
    regime = analyses["regime"].result() if "regime" in analyses else None
    tables = {key: res[key] for key in TABLES}
    if regime is not None:
        tables["regime_heads"] = regime["heads"]
    return SelectionRun(parameters=asdict(params), tables=tables, scores=res, regime=regime)


def selection_claims(res: dict) -> list:
    """The claims of Mudarisov et al. 2026 on token selection, decided from the numbers of
    :meth:`SelectionAnalysis.result`."""
    comp = res["comparison"]
    main = comp[comp.condition == MAIN].sort_values("N")
    few = main[main.N <= 4]
    beats = bool((few.diff_lo > 0).all()) if len(few) else False
    best_n = int(main.loc[main["diff"].idxmax(), "N"])
    claims = [
        Claim(
            claim="Top-N sets are more separable than random N-subsets",
            source="paper B",
            measured="F_N top − random (cosine, value space): "
            + ", ".join(
                f"N={int(r.N)} {r['diff']:+.3f} [{r.diff_lo:+.3f}, {r.diff_hi:+.3f}]" for _, r in few.iterrows()
            ),
            holds=beats,
            criterion="95% CI of the difference above 0 for every N ≤ 4",
            numbers={"comparison": main},
            ci=True,
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
                measured=f"top-{n_c} F_N (cosine): with sink {keep:.3f}, without {excl:.3f} (ratio {keep / excl:.2f})"
                if excl
                else "without sink F_N = 0",
                holds=bool(excl > 0 and keep <= 0.5 * excl),
                criterion="F_N with sink ≤ half of F_N without",
                numbers={"N": n_c, "with_sink": keep, "without_sink": excl},
            )
        )
    return claims
