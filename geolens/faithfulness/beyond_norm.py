"""Beyond the norm, asked answerably (protocol 4 §1, docs/faithfulness/v4/PROTOCOL.md).

Protocol 3 measured, in float64, the exact KL of removing each single attention term α_ij^h ṽ_j^h
at sampled positions. Within a position that KL is close to a power of the removed vector's norm
‖α ṽ‖ (log KL ≈ a + b log ‖α ṽ‖, b near 2). What a metric says *beyond* the norm is what it says
about the residual of that regression:

- **Group**: a position (primary) or a (position, head) (sensitivity), on the terms resolvable
  under protocol 3 (KL ≥ 10³ × the position's numerical floor); a group with fewer than
  ``min_terms_per_group`` such terms is left out and counted.
- **Norm removed**: the least-squares fit of y = log KL on [1, x = log ‖α ṽ‖] within the group
  (free slope and intercept), residual e = y − ŷ (:func:`norm_residuals`).
- **Statistic**: the Spearman correlation (:func:`geolens.faithfulness.ground_truth.spearman`) of the
  metric's score (protocol 3's scores,
  :func:`geolens.faithfulness.norm_controlled_stats.metric_scores`: |c| and gradient × activation
  by its absolute value) with e in the group; a position's value is its group's, or the mean over
  its heads' groups.
- **Not testable by construction**: a metric that is a function of the norm within the group
  (value-weighted; output-normalised inter within a position; and intra within a head).

:func:`beyond_norm_summary` gives each scope's statistics, the tests against 0 and the pairs as one
Holm family per scope (document-cluster bootstrap), and the regression's slope and R².
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.faithfulness.ground_truth import spearman
from geolens.stats import cluster_resample_means, holm_family, nan_to_none, percentile_ci

SCOPES = ("position", "head")


def norm_residuals(kl: np.ndarray, norm: np.ndarray) -> tuple[np.ndarray, float, float]:
    """``(e, slope, r2)``: the residuals of log KL on log norm with intercept and free slope.

    >>> norm = np.array([1.0, 2.0, 4.0, 8.0])
    >>> e, slope, r2 = norm_residuals(3.0 * norm**2, norm)
    >>> float(np.abs(e).max()) < 1e-12, round(slope, 12), round(r2, 12)
    (True, 2.0, 1.0)
    """
    kl, norm = np.asarray(kl, dtype=np.float64), np.asarray(norm, dtype=np.float64)
    if kl.size < 3 or not (np.isfinite(kl) & np.isfinite(norm) & (kl > 0) & (norm > 0)).all():
        raise ValueError("norm_residuals needs at least 3 terms with positive, finite KL and norm")
    y, x = np.log(kl), np.log(norm)
    xc, yc = x - x.mean(), y - y.mean()
    sxx = float(xc @ xc)
    slope = float(xc @ yc) / sxx if sxx > 0 else 0.0
    e = yc - slope * xc
    syy = float(yc @ yc)
    return e, slope, (1.0 - float(e @ e) / syy) if syy > 0 else float("nan")


def group_statistics(terms: pd.DataFrame, metrics, *, by, min_terms: int) -> pd.DataFrame:
    """One row per group of ``by`` columns with at least ``min_terms`` rows: ``n_terms``, ``slope``,
    ``r2`` and, per metric, the Spearman correlation of its score with the norm residual."""
    out = []
    for key, g in terms.groupby(list(by), sort=True):
        if len(g) < min_terms:
            continue
        e, slope, r2 = norm_residuals(g.kl.to_numpy(), g.norm.to_numpy())
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)), n_terms=len(g), slope=slope, r2=r2)
        for m in metrics:
            row[m] = spearman(g[m].to_numpy(), e)
        out.append(row)
    return pd.DataFrame(out)


def _resolvable(terms: pd.DataFrame, positions: pd.DataFrame, factor: float) -> tuple[pd.DataFrame, dict]:
    floors = positions.set_index(["document", "position"]).floor
    floor = floors.reindex(pd.MultiIndex.from_frame(terms[["document", "position"]])).to_numpy()
    if np.isnan(floor).any():
        raise ValueError("some terms' positions have no floor in the positions table")
    keep = terms.kl.to_numpy() >= factor * floor
    return terms[keep], dict(n_terms=int(len(terms)), n_resolvable=int(keep.sum()), share=float(keep.mean()))


def _scope_summary(
    terms, section, scope: str, n_boot: int, seed: int, alpha: float, cache: dict | None, n_groups_all: int
) -> dict:
    metrics = list(section["metrics"][scope])
    sanity = list(section.get("sanity", []))
    min_terms = int(section["min_terms_per_group"])
    by = ["document", "position"] + (["head"] if scope == "head" else [])
    if cache is not None and scope in cache:  # whole positions left out: the others' groups are unchanged
        here = pd.MultiIndex.from_frame(terms[["document", "position"]].drop_duplicates())
        groups = cache[scope][pd.MultiIndex.from_frame(cache[scope][["document", "position"]]).isin(here)]
    else:
        groups = group_statistics(terms, metrics + sanity, by=by, min_terms=min_terms)
        if cache is not None:
            cache[scope] = groups
    per_position = groups.groupby(["document", "position"])[metrics + sanity + ["slope", "r2"]].mean()
    documents = per_position.index.get_level_values("document").to_numpy()

    def resampled(v: np.ndarray) -> np.ndarray:  # document-cluster resamples, the same draws for every metric
        return cluster_resample_means(v, documents, n_boot, seed, omit_nan=True)

    def values(m: str) -> np.ndarray:
        return per_position[m].to_numpy()

    def interval(v: np.ndarray) -> dict:
        lo, hi = percentile_ci(resampled(v), 0.95, omit_nan=True)
        return dict(mean=float(np.nanmean(v)), ci_low=float(lo), ci_high=float(hi))

    tests, diffs = [], []
    for m in metrics:
        tests.append(dict(kind="beyond_norm", a=None, b=m))
        diffs.append(values(m))
    for a, b in section["pairs"]:
        if a in metrics and b in metrics:
            tests.append(dict(kind="pair", a=a, b=b))
            diffs.append(values(b) - values(a))
    decided = holm_family([np.nanmean(d) for d in diffs], [resampled(d) for d in diffs], alpha=alpha)
    n_positions, n_documents = len(per_position), len(set(documents))
    tests = [
        nan_to_none(dict(t, **r._asdict())) | dict(n_positions=n_positions, n_documents=n_documents)
        for t, r in zip(tests, decided)
    ]
    slope, r2 = groups.slope.to_numpy(), groups.r2.to_numpy()
    return dict(
        scope=scope,
        n_groups=int(len(groups)),
        n_groups_left_out=n_groups_all - int(len(groups)),
        n_positions=n_positions,
        n_documents=n_documents,
        metrics=[dict(metric=m, **interval(values(m))) for m in metrics],
        sanity=[dict(metric=m, **interval(values(m))) for m in sanity],
        tests=tests,
        regression=dict(
            slope_mean=float(slope.mean()),
            slope_p5=float(np.percentile(slope, 5)),
            slope_p95=float(np.percentile(slope, 95)),
            r2_mean=float(np.nanmean(r2)),
            r2_p5=float(np.nanpercentile(r2, 5)),
            r2_p95=float(np.nanpercentile(r2, 95)),
        ),
        not_testable=[
            dict(metric=m, verdict="not testable", why=w)
            for m, w in section["not_testable_by_construction"][scope].items()
        ],
    )


def beyond_norm_summary(terms: pd.DataFrame, positions: pd.DataFrame, protocol, *, groups: dict | None = None) -> dict:
    """Protocol 4 §1 from protocol 3's stored rows (module docstring): ``terms``
    (``per_term_terms.csv.gz``) and ``positions`` (``per_term_positions.csv.gz``); ``protocol``: the
    twin (its ``beyond_norm`` and ``statistics`` sections). The primary scope's tests are
    ``tests``, the sensitivity scope's ``sensitivity_tests``. ``groups``: a dict that keeps the
    per-group statistics of the first call, reused by later calls on the same rows with whole
    positions left out (:mod:`geolens.stability`)."""
    section, stats = protocol["beyond_norm"], protocol["statistics"]
    n_boot, seed, alpha = int(stats["n_boot"]), int(stats["seed"]), float(stats["alpha"])
    from geolens.faithfulness.norm_controlled_stats import metric_scores

    scores = metric_scores(terms)  # protocol 3's scores: |c|, gradient × activation by |·| (KL orientation)
    terms = terms.assign(**{m: scores[m] for m in scores if m != "value_weighted"})
    kept, counts = _resolvable(terms, positions, float(section["resolvable_factor"]))
    n_all = {  # every group, also those without a resolvable term: each left out is counted
        scope: int(terms.groupby(["document", "position"] + (["head"] if scope == "head" else [])).ngroups)
        for scope in SCOPES
    }
    primary = _scope_summary(kept, section, "position", n_boot, seed, alpha, groups, n_all["position"])
    sensitivity = _scope_summary(kept, section, "head", n_boot, seed, alpha, groups, n_all["head"])
    agree = {(t["kind"], t["a"], t["b"]): t["verdict"] for t in sensitivity["tests"]}
    return dict(
        terms=counts,
        n_boot=n_boot,
        seed=seed,
        alpha=alpha,
        primary=primary,
        sensitivity=sensitivity,
        tests=primary["tests"],
        sensitivity_tests=sensitivity["tests"],
        same_verdict_within_heads={
            t["b"] if t["kind"] == "beyond_norm" else f"{t['a']} -> {t['b']}": agree.get((t["kind"], t["a"], t["b"]))
            for t in primary["tests"]
        },
        claimed_order=dict(verdict="not testable", why=section["claimed_order"]),
    )


def _f(x) -> str:
    return "–" if x is None else f"{x:+.3f}"


def render_lines(summary: dict) -> list[str]:
    """The README body of a beyond-the-norm summary."""
    t = summary["terms"]
    lines = [
        f"Terms resolvable (KL ≥ 10³ × floor): {t['n_resolvable']} of {t['n_terms']} ({t['share']:.1%}).",
        "",
    ]
    for key, title in (("primary", "Within a position (primary)"), ("sensitivity", "Within a head (sensitivity)")):
        s = summary[key]
        r = s["regression"]
        lines += [
            f"## {title}",
            "",
            f"{s['n_positions']} positions from {s['n_documents']} documents ({s['n_groups']} groups; "
            f"{s['n_groups_left_out']} with fewer than the minimum of resolvable terms left out). "
            f"log KL on log ‖α ṽ‖: slope {r['slope_mean']:.2f} (5–95 %: {r['slope_p5']:.2f}–{r['slope_p95']:.2f}), "
            f"R² {r['r2_mean']:.3f} ({r['r2_p5']:.3f}–{r['r2_p95']:.3f}).",
            "",
            "| test | mean Spearman with the residual (Δ for pairs) | interval (level) | verdict |",
            "|---|---|---|---|",
        ]
        for test in s["tests"]:
            name = test["b"] if test["kind"] == "beyond_norm" else f"{test['a']} → {test['b']}"
            level = "" if test.get("level") is None else f" ({test['level']:.4f})"
            lines.append(
                f"| {name} | {_f(test['estimate'])} | [{_f(test['ci_low'])}, {_f(test['ci_high'])}]{level} | {test['verdict']} |"
            )
        for m in s["sanity"]:
            lines.append(
                f"| {m['metric']} (sanity, no test) | {_f(m['mean'])} | [{_f(m['ci_low'])}, {_f(m['ci_high'])}] (0.95) | – |"
            )
        for m in s["not_testable"]:
            lines.append(f"| {m['metric']} | – | – | not testable: {m['why']} |")
        lines.append("")
    lines.append(f"The claimed order: not testable as an order ({summary['claimed_order']['why']}).")
    return lines


__all__ = ["SCOPES", "beyond_norm_summary", "group_statistics", "norm_residuals", "render_lines"]
