"""Bootstrap confidence intervals, paired comparisons, verdicts and multiple testing: the one place.

Every confidence interval of geolens comes from here (faithfulness curves and AUCs, multiple
choice, the sink controls, token selection), so that all of them resample, take percentiles and
decide in the same way.

- **Resampling** (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 6):
  :func:`bootstrap_indices` draws ``n_boot`` resamples of ``n`` units with replacement, the draw
  being ``Generator.integers(0, n, size=(n_boot, n))`` of ``numpy.random.default_rng(seed)``;
  nothing else in geolens draws bootstrap indices. :func:`cluster_bootstrap_indices` resamples
  whole clusters (e.g. the windows cut from one source document): clusters are drawn with
  replacement (the same draw, over clusters) and every row of a drawn cluster is taken together.
- **Percentile interval** (Efron & Tibshirani 1993, §13.3): :func:`percentile_ci` gives
  [Q(α/2), Q(1 − α/2)] of the bootstrap distribution, α = 1 − level, where Q is numpy's default
  quantile (``method="linear"``, Hyndman & Fan 1996 type 7: Q(p) interpolates linearly between
  the order statistics x_(⌊h⌋) and x_(⌊h⌋+1), h = (B − 1)·p, 0-based). α/2 is computed as
  ``(1 - level) / 2`` in float64 and the upper probability as ``1 - α/2`` (for level 0.95:
  0.025000000000000022 and 0.975, the probabilities every interval of geolens has used).
- **Means and paired comparisons**: :func:`resample_means`, :func:`mean_ci` (mean over units),
  :func:`paired_bootstrap` (b against a on the same resamples: mean difference or ratio of
  means), all with ``groups=`` for cluster resampling and ``omit_nan=`` to ignore missing values.
- **Decisions**: :func:`verdict` (``holds`` / ``reversed`` / ``tie`` / ``not testable`` from a
  CI of "b − a"), :func:`bootstrap_pvalue` (two-sided, from the bootstrap distribution) and
  :func:`holm` (Holm 1979, Scand. J. Statist. 6:65–70, step-down adjusted p-values);
  :func:`holm_family` decides a whole family by intervals within Holm's step-down
  (docs/faithfulness/PROTOCOL.md §4).

Seeds: every function that draws takes ``seed``, an integer or a ``numpy.random.Generator``
(``numpy.random.default_rng(seed)`` returns a Generator unchanged), so that one generator can
serve several draws in turn.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal, NamedTuple, Sequence

import numpy as np

Seed = int | np.random.Generator | None
Verdict = Literal["holds", "reversed", "tie", "not testable"]
VERDICTS: tuple[str, ...] = ("holds", "reversed", "tie", "not testable")


class Interval(NamedTuple):
    """A point estimate with its confidence interval; unpacks as ``estimate, low, high``.

    Scalars (``numpy.float64``) for one series, arrays ``x.shape[1:]`` for several columns.
    """

    estimate: np.ndarray | float
    low: np.ndarray | float
    high: np.ndarray | float


def _check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return level


def _check_n_boot(n_boot: int) -> int:
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be an integer ≥ 1, got {n_boot}")
    return int(n_boot)


# ---------------------------------------------------------------------------------------------
# Resampling


def bootstrap_indices(n: int, n_boot: int, seed: Seed = 0) -> np.ndarray:
    """``[n_boot, n]`` row indices: ``n_boot`` resamples of ``n`` units drawn with replacement.

    The draw is ``numpy.random.default_rng(seed).integers(0, n, size=(n_boot, n))`` (each index
    uniform on {0, …, n − 1}, independent). ``seed``: an integer, or a ``Generator`` that is
    advanced (to draw several resample sets in turn from one stream).

    >>> bootstrap_indices(4, 3, seed=0).shape
    (3, 4)
    >>> bool((bootstrap_indices(5, 100, seed=1) < 5).all())
    True
    """
    if int(n) != n or n < 1:
        raise ValueError(f"need at least one unit to resample, got n = {n}")
    return np.random.default_rng(seed).integers(0, int(n), size=(_check_n_boot(n_boot), int(n)))


def _cluster_codes(groups) -> tuple[np.ndarray, list[np.ndarray]]:
    """(cluster code per row, rows of each cluster); clusters in sorted order of their labels."""
    g = np.asarray(groups)
    if g.ndim != 1 or g.size < 1:
        raise ValueError(f"groups must be a non-empty 1-D array of cluster labels, got shape {g.shape}")
    _, codes = np.unique(g, return_inverse=True)
    codes = codes.reshape(-1)
    order = np.argsort(codes, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
    return codes, members


def cluster_bootstrap_indices(groups, n_boot: int, seed: Seed = 0) -> list[np.ndarray]:
    """Cluster (block) bootstrap: ``n_boot`` resamples, each a 1-D array of row indices.

    ``groups[i]`` is the cluster (e.g. source document) of row i. Each resample draws G clusters
    with replacement out of the G distinct ones (the draw of :func:`bootstrap_indices` over
    clusters, clusters numbered in sorted order of their labels) and takes *all* rows of every
    drawn cluster, in their original order, once per draw. Rows of one cluster therefore always
    enter a resample together; a resample's length varies when clusters differ in size. With
    one row per cluster, labels ``0 … n − 1`` in row order, it equals :func:`bootstrap_indices`.

    >>> docs = ["a", "a", "b", "b", "b", "c"]  # rows 0-1 from document a, rows 2-4 from b, row 5 from c
    >>> [r.tolist() for r in cluster_bootstrap_indices(docs, 2, seed=0)]
    [[5, 2, 3, 4, 2, 3, 4], [0, 1, 0, 1, 0, 1]]
    """
    codes, members = _cluster_codes(groups)
    draws = bootstrap_indices(len(members), n_boot, seed)  # [n_boot, G]
    return [np.concatenate([members[c] for c in row]) for row in draws]


def resample_means(x, indices, *, omit_nan: bool = False) -> np.ndarray:
    """Mean over the units of each resample: ``[n_boot, ...]`` from ``x`` ``[n, ...]`` (axis 0: units).

    ``indices``: the ``[n_boot, n]`` array of :func:`bootstrap_indices` (mean = ``x[indices].mean(1)``)
    or the list of :func:`cluster_bootstrap_indices` (one index array per resample).
    ``omit_nan``: mean over the non-NaN values of the resample (NaN where it has none).

    >>> resample_means(np.array([1.0, 2.0, 4.0]), np.array([[0, 0, 2], [1, 2, 2]]))
    array([2.        , 3.33333333])
    """
    x = np.asarray(x, dtype=np.float64)
    mean = _nanmean if omit_nan else np.mean
    if isinstance(indices, np.ndarray) and indices.ndim == 2:
        return mean(x[indices], axis=1)
    return np.stack([mean(x[np.asarray(i)], axis=0) for i in indices])


def cluster_resample_means(x, groups, n_boot: int, seed: Seed = 0, *, omit_nan: bool = False) -> np.ndarray:
    """:func:`resample_means` over the resamples of :func:`cluster_bootstrap_indices` (the same
    draws of clusters), computed from per-cluster sums and counts: ``[n_boot]`` for ``x`` ``[n]``.
    Equal to ``resample_means(x, cluster_bootstrap_indices(groups, n_boot, seed), omit_nan=...)``
    up to the order of float summation, in a fraction of its time (one matrix product).

    >>> x, g = np.array([1.0, 3.0, 10.0, np.nan]), ["a", "a", "b", "b"]
    >>> slow = resample_means(x, cluster_bootstrap_indices(g, 50, seed=1), omit_nan=True)
    >>> bool(np.allclose(cluster_resample_means(x, g, 50, seed=1, omit_nan=True), slow))
    True
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    codes, members = _cluster_codes(groups)
    if codes.size != x.size:
        raise ValueError(f"groups must label every row: {codes.size} labels for {x.size} rows")
    if np.isinf(x).any() or (not omit_nan and np.isnan(x).any()):  # the exact semantics, the slow way
        return resample_means(x, cluster_bootstrap_indices(groups, n_boot, seed), omit_nan=omit_nan)
    draws = bootstrap_indices(len(members), n_boot, seed)  # [n_boot, G], as cluster_bootstrap_indices
    counts = np.zeros((draws.shape[0], len(members)))
    np.add.at(counts, (np.arange(draws.shape[0])[:, None], draws), 1.0)
    finite = ~np.isnan(x) if omit_nan else np.ones(x.size, dtype=bool)
    sums = np.bincount(codes, weights=np.where(finite, x, 0.0), minlength=len(members))
    sizes = np.bincount(codes, weights=finite.astype(np.float64), minlength=len(members))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (counts @ sums) / (counts @ sizes)


def _nanmean(x, axis):
    """``np.nanmean`` without its warning for an all-NaN slice (NaN there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def _draw(n: int, n_boot: int, seed: Seed, groups):
    if groups is None:
        return bootstrap_indices(n, n_boot, seed)
    if len(groups) != n:
        raise ValueError(f"groups must label every row: {len(groups)} labels for {n} rows")
    return cluster_bootstrap_indices(groups, n_boot, seed)


# ---------------------------------------------------------------------------------------------
# Intervals


def percentile_ci(samples, level: float = 0.95, *, axis: int = 0, omit_nan: bool = False) -> tuple:
    """(low, high): the percentile bootstrap interval of ``samples`` along ``axis``.

    low = Q(α/2), high = Q(1 − α/2), α = 1 − ``level``, Q numpy's default linear-interpolation
    quantile of the bootstrap distribution (Efron & Tibshirani 1993, §13.3; Hyndman & Fan type 7):
    ``np.quantile(samples, [(1 - level) / 2, 1 - (1 - level) / 2], axis=axis)``. ``omit_nan``: the
    quantiles of the non-NaN samples (``np.nanquantile``); otherwise a NaN sample gives NaN.

    >>> [float(v) for v in percentile_ci(np.arange(101.0), 0.5)]  # Q(0.25), Q(0.75) of 0, 1, ..., 100
    [25.0, 75.0]
    """
    level = _check_level(level)
    a = (1.0 - level) / 2.0
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no bootstrap samples")
    lo, hi = (np.nanquantile if omit_nan else np.quantile)(x, [a, 1.0 - a], axis=axis)
    return lo, hi


def mean_ci(
    x,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: Seed = 0,
    indices=None,
    groups=None,
    omit_nan: bool = False,
) -> Interval:
    """Mean over units (axis 0 of ``x``) with its percentile bootstrap CI.

    estimate = mean of x over axis 0; bootstrap distribution = the means of ``n_boot`` resamples
    (:func:`bootstrap_indices`, or :func:`cluster_bootstrap_indices` of ``groups``: the mean over
    all rows of the drawn clusters); interval = :func:`percentile_ci`. ``indices`` reuses
    resamples already drawn (``n_boot``, ``seed`` and ``groups`` are then not used), e.g. the
    same resamples for several columns. ``omit_nan``: NaN rows are left out of every mean (the
    estimate's and each resample's) and resamples without any value out of the percentiles.

    >>> m, lo, hi = mean_ci(np.array([1.0, 2.0, 3.0, 4.0]), n_boot=500, seed=0)
    >>> float(m), bool(1.0 <= lo < m < hi <= 4.0)
    (2.5, True)
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 1 or x.shape[0] < 1:
        raise ValueError(f"need at least one unit along axis 0, got shape {x.shape}")
    if indices is None:
        indices = _draw(x.shape[0], n_boot, seed, groups)
    means = resample_means(x, indices, omit_nan=omit_nan)
    estimate = _nanmean(x, axis=0) if omit_nan else x.mean(axis=0)
    lo, hi = percentile_ci(means, level, omit_nan=omit_nan)
    return Interval(estimate, lo, hi)


def paired_bootstrap(
    a,
    b,
    *,
    statistic: Literal["difference", "ratio"] = "difference",
    n_boot: int = 2000,
    level: float = 0.95,
    seed: Seed = 0,
    indices=None,
    groups=None,
    omit_nan: bool = False,
) -> Interval:
    """b against a, measured on the same units (rows) and resampled together (paired).

    - ``"difference"``: mean_i (b_i − a_i), the mean paired difference (= mean b − mean a without
      missing values; with ``omit_nan``, over the rows where both are present);
    - ``"ratio"``: (mean_i b_i) / (mean_i a_i), the ratio of the means on each resample.

    Resamples, ``groups``, ``indices`` and the interval as :func:`mean_ci`: both series use the
    same resampled rows, so the interval is that of the paired statistic.

    >>> a = np.array([1.0, 2.0, 3.0, 4.0, 5.0]); b = a + 1.0
    >>> [round(float(v), 6) for v in paired_bootstrap(a, b, n_boot=200)]
    [1.0, 1.0, 1.0]
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired series must have the same shape, got {a.shape} and {b.shape}")
    if statistic == "difference":
        return mean_ci(b - a, n_boot=n_boot, level=level, seed=seed, indices=indices, groups=groups, omit_nan=omit_nan)
    if statistic != "ratio":
        raise ValueError(f"statistic must be 'difference' or 'ratio', got {statistic!r}")
    if a.ndim < 1 or a.shape[0] < 1:
        raise ValueError(f"need at least one unit along axis 0, got shape {a.shape}")
    if omit_nan:
        both = np.isnan(a) | np.isnan(b)
        a, b = np.where(both, np.nan, a), np.where(both, np.nan, b)
    if indices is None:
        indices = _draw(a.shape[0], n_boot, seed, groups)
    mean = (lambda v: _nanmean(v, axis=0)) if omit_nan else (lambda v: v.mean(axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        samples = resample_means(b, indices, omit_nan=omit_nan) / resample_means(a, indices, omit_nan=omit_nan)
        estimate = mean(b) / mean(a)
    lo, hi = percentile_ci(samples, level, omit_nan=omit_nan)
    return Interval(estimate, lo, hi)


# ---------------------------------------------------------------------------------------------
# Decisions


def control_difference_samples(effect, control, *, n_boot: int = 2000, seed: Seed = 0) -> np.ndarray:
    """Bootstrap samples of mean(effect) − mean(control) where ``effect`` is ``[unit]`` and
    ``control`` ``[draw, unit]`` (a random control drawn several times on the same units): each
    resample draws the units and, independently, the draws, with replacement (two stages), so the
    interval covers the choice of units and the luck of the draws; one unit leaves the draws only.
    Used by :class:`geolens.intervene.RegimeAblation`.

    >>> effect, control = np.array([1.0, 2.0]), np.array([[0.5, 1.5], [0.5, 1.5]])  # every unit: 0.5 above
    >>> s = control_difference_samples(effect, control, n_boot=50)
    >>> s.shape, bool(np.allclose(s, 0.5))
    ((50,), True)
    """
    effect = np.asarray(effect, dtype=np.float64)
    control = np.asarray(control, dtype=np.float64)
    if effect.ndim != 1 or control.ndim != 2 or control.shape[1] != effect.shape[0] or control.shape[0] < 1:
        raise ValueError(f"effect must be [unit] and control [draw, unit], got {effect.shape} and {control.shape}")
    n_draw, n_unit = control.shape
    rng = np.random.default_rng(seed)
    out = np.empty(_check_n_boot(n_boot))
    for b in range(out.shape[0]):
        t = rng.integers(0, n_unit, n_unit) if n_unit > 1 else np.zeros(1, dtype=int)
        r = rng.integers(0, n_draw, n_draw)
        out[b] = effect[t].mean() - control[np.ix_(r, t)].mean()
    return out


def verdict(ci_low: float, ci_high: float, *, testable: bool = True) -> Verdict:
    """The decision of a CI of "b − a" (a positive difference means b is larger / better).

    ``holds`` when the whole interval lies above 0 (ci_low > 0), ``reversed`` when it lies below
    0 (ci_high < 0), ``tie`` when it contains 0. ``testable=False`` (the two conditions are the
    same by construction, e.g. identical masks, so the difference is 0 without any measurement):
    ``not testable``, never ``tie``.

    >>> verdict(0.1, 0.3), verdict(-0.3, -0.1), verdict(-0.1, 0.2), verdict(0.0, 0.0, testable=False)
    ('holds', 'reversed', 'tie', 'not testable')
    """
    if not testable:
        return "not testable"
    lo, hi = float(ci_low), float(ci_high)
    if np.isnan(lo) or np.isnan(hi):
        raise ValueError(f"a verdict needs a confidence interval, got [{lo}, {hi}]")
    if lo > hi:
        raise ValueError(f"ci_low must be ≤ ci_high, got [{lo}, {hi}]")
    if lo > 0:
        return "holds"
    if hi < 0:
        return "reversed"
    return "tie"


def bootstrap_pvalue(samples, null: float = 0.0) -> float:
    """Two-sided bootstrap p-value of "the statistic equals ``null``" from its bootstrap distribution.

    p = min(1, 2 · min((1 + #{θ*_b ≤ null}) / (B + 1), (1 + #{θ*_b ≥ null}) / (B + 1))), B the
    number of (non-NaN) bootstrap samples θ*_b of the statistic, e.g. of a paired difference
    (Davison & Hinkley 1997, *Bootstrap Methods and their Application*, §4.4, eq. 4.11, with the
    +1 that keeps p ≥ 2/(B + 1) > 0). Up to that +1 and the discreteness of B, p < α exactly when
    the percentile interval at level 1 − α excludes ``null``.

    >>> bootstrap_pvalue(np.linspace(0.1, 1.0, 999))  # every sample above 0: the smallest p
    0.002
    """
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    x = x[~np.isnan(x)]
    if x.size == 0:
        raise ValueError("no bootstrap samples")
    B = x.size
    below = (1 + np.count_nonzero(x <= null)) / (B + 1)
    above = (1 + np.count_nonzero(x >= null)) / (B + 1)
    return float(min(1.0, 2.0 * min(below, above)))


def nan_to_none(record: dict) -> dict:
    """``record`` with every float NaN replaced by None (a test's record as JSON writes it: a "not
    testable" comparison has no interval).

    >>> nan_to_none({"ci_low": float("nan"), "verdict": "not testable", "rank": 0})
    {'ci_low': None, 'verdict': 'not testable', 'rank': 0}
    """
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in record.items()}


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (Holm 1979, Scand. J. Statist. 6:65–70), in input order.

    With the m p-values sorted ascending, p_(1) ≤ … ≤ p_(m):
    p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)) (step-down, monotone, capped at 1). Rejecting
    every hypothesis with p̃ ≤ α controls the family-wise error rate at α.

    >>> holm([0.01, 0.04, 0.03, 0.005]).round(6).tolist()
    [0.03, 0.06, 0.06, 0.02]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"pvalues must be 1-D, got shape {p.shape}")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("p-values must be numbers in [0, 1]")
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


class FamilyTest(NamedTuple):
    """One test of a Holm family (:func:`holm_family`), in the input order."""

    estimate: float  # the observed statistic (Δ = S(b) − S(a); > 0: b better)
    ci_low: float  # percentile interval at ``level`` (NaN when not testable)
    ci_high: float
    level: float  # 1 − α/(m − r + 1), r the 1-based rank by raw p (NaN when not testable)
    p: float  # raw two-sided bootstrap p (:func:`bootstrap_pvalue`; NaN when not testable)
    p_adj: float  # Holm-adjusted p (NaN when not testable)
    rank: int  # 1-based rank by raw p within the testable tests (0 when not testable)
    verdict: str  # holds / reversed / tie / not testable
    holm_stopped_at: int  # the rank where the step-down stopped (0: it never stopped)
    rules_differ: bool  # p_adj < α and the interval rule disagree (discreteness of B only)


def holm_family(estimates, samples, *, testable=None, alpha: float = 0.05) -> list[FamilyTest]:
    """Verdicts of one family of paired comparisons, decided by intervals within Holm's step-down.

    ``samples[t]`` is test t's bootstrap distribution of Δ (> 0: "b better"); ``testable[t]``
    False marks a comparison that cannot differ by construction (identical rankings or masks):
    it is ``"not testable"`` and left out of the family (its m). For the m testable tests sorted
    by raw p (:func:`bootstrap_pvalue`, ties kept in input order), the test of rank r gets the
    percentile interval at level 1 − α/(m − r + 1) (:func:`percentile_ci`) and, walking up the
    ranks, ``holds`` (interval above 0) or ``reversed`` (below 0) while every lower rank was
    decided; from the first undecided rank on, every test is a ``tie`` (Holm's step-down stops
    there: ``holm_stopped_at``). So a verdict never contradicts the interval reported with it.
    ``p_adj`` is :func:`holm`'s; ``rules_differ`` flags a test where "p_adj < α" and the interval
    rule disagree, which only the discreteness of B can cause.

    >>> rng = np.random.default_rng(0)
    >>> tests = holm_family([0.5, 0.01, -0.4], [rng.normal(0.5, 0.1, 2000), rng.normal(0.01, 0.1, 2000),
    ...                      rng.normal(-0.4, 0.1, 2000)], testable=[True, True, True])
    >>> [t.verdict for t in tests], [t.rank for t in tests]
    (['holds', 'tie', 'reversed'], [1, 3, 2])
    """
    estimates = [float(e) for e in estimates]
    samples = [np.asarray(x, dtype=np.float64).reshape(-1) for x in samples]
    if len(samples) != len(estimates):
        raise ValueError(f"{len(estimates)} estimates for {len(samples)} bootstrap distributions")
    testable = [True] * len(estimates) if testable is None else [bool(t) for t in testable]
    if len(testable) != len(estimates):
        raise ValueError(f"testable must flag every test: {len(testable)} flags for {len(estimates)} tests")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    live = [t for t in range(len(estimates)) if testable[t]]
    p = {t: bootstrap_pvalue(samples[t]) for t in live}
    p_adj = dict(zip(live, holm([p[t] for t in live]))) if live else {}
    order = sorted(live, key=lambda t: p[t])  # stable: ties keep the input order
    m = len(order)
    nan = float("nan")
    out: dict[int, FamilyTest] = {}
    stopped = 0
    for r, t in enumerate(order, start=1):
        level = 1.0 - alpha / (m - r + 1)
        lo, hi = (float(v) for v in percentile_ci(samples[t], level, omit_nan=True))
        decision = verdict(lo, hi)
        if stopped or decision == "tie":
            stopped = stopped or r
            decision = "tie"
        by_p = p_adj[t] < alpha
        out[t] = FamilyTest(
            estimates[t], lo, hi, level, p[t], float(p_adj[t]), r, decision, stopped, bool(by_p != (decision != "tie"))
        )
    for t in range(len(estimates)):
        if t not in out:
            out[t] = FamilyTest(estimates[t], nan, nan, nan, nan, nan, 0, "not testable", 0, False)
    return [out[t] for t in range(len(estimates))]


__all__ = [
    "control_difference_samples",
    "FamilyTest",
    "Interval",
    "VERDICTS",
    "bootstrap_indices",
    "bootstrap_pvalue",
    "cluster_bootstrap_indices",
    "cluster_resample_means",
    "holm",
    "holm_family",
    "mean_ci",
    "nan_to_none",
    "paired_bootstrap",
    "percentile_ci",
    "resample_means",
    "verdict",
]
