"""The statistics of protocol 3's per-term endpoint, per position (docs/faithfulness/v3/PROTOCOL.md §5, §7).

:func:`partial_spearman` (the primary statistic: a metric's Spearman correlation with the KL
given the norm ‖α_ij^h ṽ_j^h‖ of the removed term) and :func:`strata_spearman` (plain Spearman
within strata of the norm); :func:`position_statistics` gives every analysis of :data:`ANALYSES`
for one position's terms, and :func:`statistics_table` for every position of a run.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from geolens.faithfulness.ground_truth import MIN_TERMS, TERM_METRICS, _average_ranks, spearman

DEGENERATE = 1e-12  # 1 − r² at or below this: the ranks are (anti-)identical
ANALYSES = (
    "norm_controlled",
    "plain",
    "strata",
    "resolvable_partial",
    "resolvable_plain",
    "top_decile_partial",
    "top_decile_plain",
    "signed_partial",
    "signed_plain",
    "magnitude_partial",
    "magnitude_plain",
)


def _rank_corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def partial_spearman(scores, effects, norm) -> float:
    """The partial Spearman correlation of ``scores`` with ``effects`` given ``norm``: rank all three
    (average ranks for ties), take the Pearson correlations of the ranks r_se, r_sn, r_en, and
    return (r_se − r_sn r_en) / √((1 − r_sn²)(1 − r_en²)).

    0.0 when the scores are constant or rank as the norm does (1 − r_sn² ≤ 10⁻¹²: nothing beyond
    the norm); NaN when the effects or the norm are constant or the effects rank as the norm does
    (undefined: the position is excluded).

    >>> n = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> partial_spearman(n * 2, np.array([0.1, 0.3, 0.2, 0.5, 0.4]), n)  # ranks as the norm: 0
    0.0
    >>> round(partial_spearman(np.array([0.0, 1, 0, 1, 0]), np.array([1.0, 3, 2, 5, 4]), n), 3)
    0.962
    """
    s, e, n = (np.asarray(x, dtype=np.float64) for x in (scores, effects, norm))
    if np.ptp(e) == 0 or np.ptp(n) == 0:
        return float("nan")
    rn, re_ = _average_ranks(n), _average_ranks(e)
    r_en = _rank_corr(re_, rn)
    if 1.0 - r_en * r_en <= DEGENERATE:
        return float("nan")
    if np.ptp(s) == 0:
        return 0.0
    rs = _average_ranks(s)
    r_sn = _rank_corr(rs, rn)
    if 1.0 - r_sn * r_sn <= DEGENERATE:
        return 0.0
    r_se = _rank_corr(rs, re_)
    return float((r_se - r_sn * r_en) / np.sqrt((1.0 - r_sn * r_sn) * (1.0 - r_en * r_en)))


def strata_spearman(scores, effects, norm, n_strata: int = 5, min_terms: int = MIN_TERMS) -> float:
    """The plain Spearman correlation within strata of equal counts by the rank of ``norm`` (the
    last stratum takes the remainder), averaged over the strata with at least ``min_terms`` terms
    and unequal effects, weighted by their counts; NaN when no stratum qualifies.

    >>> n = np.arange(10.0)
    >>> strata_spearman(n, n, n, n_strata=2)
    1.0
    """
    s, e, n = (np.asarray(x, dtype=np.float64) for x in (scores, effects, norm))
    order = np.argsort(n, kind="stable")
    size = len(order) // n_strata
    if size == 0:
        return float("nan")
    total = weight = 0.0
    for k in range(n_strata):
        part = order[k * size : (k + 1) * size if k < n_strata - 1 else len(order)]
        if len(part) < min_terms or np.ptp(e[part]) == 0:
            continue
        total += len(part) * spearman(s[part], e[part])
        weight += len(part)
    return total / weight if weight else float("nan")


def metric_scores(terms: pd.DataFrame, metrics: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Each metric's scores (KL orientation) from a ``terms`` table: value-weighted is the norm,
    |contribution| its absolute value, gradient × activation (top-1) by |·|. ``metrics``: only
    these (in :data:`TERM_METRICS` order; the table needs only their columns); default: all."""
    wanted = [m for m in TERM_METRICS if metrics is None or m in metrics]
    derived = {
        "value_weighted": lambda: terms["norm"].to_numpy(np.float64),
        "contribution_abs": lambda: np.abs(terms["contribution"].to_numpy(np.float64)),
        "grad_x_act": lambda: np.abs(terms["grad_x_act"].to_numpy(np.float64)),
    }
    return {m: derived[m]() if m in derived else terms[m].to_numpy(np.float64) for m in wanted}


def position_statistics(
    terms: pd.DataFrame, floor: float, *, resolvable_factor: float = 1e3, metrics: Sequence[str] | None = None
) -> dict:
    """``{analysis: {metric: value}}`` of one position's ``terms`` (PROTOCOL.md §5, §7); NaN where
    the position is excluded from that analysis (fewer than 5 terms, constant effects, ...).
    ``metrics``: only these (:func:`metric_scores`)."""
    scores = metric_scores(terms, metrics)
    kl = terms["kl"].to_numpy(np.float64)
    norm = terms["norm"].to_numpy(np.float64)
    dlogp = terms["delta_logp_next"].to_numpy(np.float64)
    signed, magnitude = dict(scores), dict(scores)
    if "grad_x_act" in scores:  # its signed and magnitude analyses score the next token's gradient × activation
        signed["grad_x_act"] = -terms["grad_x_act_next"].to_numpy(np.float64)
        magnitude["grad_x_act"] = np.abs(terms["grad_x_act_next"].to_numpy(np.float64))
    nan = float("nan")

    def both(name: str, keep: np.ndarray | None, table: dict, effect: np.ndarray) -> dict:
        sel = np.ones(len(effect), bool) if keep is None else keep
        out = {f"{name}_partial": {}, f"{name}_plain": {}}
        ok = sel.sum() >= MIN_TERMS and np.ptp(effect[sel]) > 0
        for m, s in table.items():
            out[f"{name}_partial"][m] = partial_spearman(s[sel], effect[sel], norm[sel]) if ok else nan
            out[f"{name}_plain"][m] = spearman(s[sel], effect[sel]) if ok else nan
        return out

    enough = len(kl) >= MIN_TERMS and np.ptp(kl) > 0
    result = {
        "norm_controlled": {m: partial_spearman(s, kl, norm) if enough else nan for m, s in scores.items()},
        "plain": {m: spearman(s, kl) if enough else nan for m, s in scores.items()},
        "strata": {m: strata_spearman(s, kl, norm) if enough else nan for m, s in scores.items()},
    }
    result.update(both("resolvable", kl >= resolvable_factor * floor, scores, kl))
    top = kl >= np.quantile(kl, 0.9) if len(kl) else np.zeros(0, bool)
    result.update(both("top_decile", top, scores, kl))
    result.update(both("signed", None, signed, -dlogp))
    result.update(both("magnitude", None, magnitude, np.abs(dlogp)))
    return result


def statistics_table(
    terms: pd.DataFrame,
    positions: pd.DataFrame,
    *,
    resolvable_factor: float = 1e3,
    metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per (document, position, analysis, metric) with its ``value`` (:func:`position_statistics`;
    ``metrics``: only these)."""
    floors = positions.set_index(["document", "position"])["floor"]
    rows = []
    for (d, p), part in terms.groupby(["document", "position"], sort=True):
        ids = positions[(positions.document == d) & (positions.position == p)].iloc[0]
        stats = position_statistics(
            part, float(floors.loc[(d, p)]), resolvable_factor=resolvable_factor, metrics=metrics
        )
        for analysis, values in stats.items():
            for metric, value in values.items():
                rows.append(
                    dict(
                        document=int(d),
                        position=int(p),
                        layer=int(ids.layer),
                        analysis=analysis,
                        metric=metric,
                        value=value,
                    )
                )
    return pd.DataFrame(rows)
