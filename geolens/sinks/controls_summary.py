"""The statistics of the dose-matched sink controls (docs/faithfulness/PROTOCOL.md §6).

**Statistics** (:func:`dose_summary`, all resampling from :mod:`geolens.stats`): documents are
the clusters. One generator ``numpy.random.default_rng(seed)`` draws, in this order, B document
resamples (:func:`geolens.stats.cluster_bootstrap_indices`: documents with replacement, each
bringing both of its windows) and then, for each angle in ascending order, B seed resamples
(:func:`geolens.stats.bootstrap_indices` over that angle's seeds). Resample b of a rotation's mean
is the mean of x[w, s] over the windows w of document resample b and the seeds s of seed resample
b (seeds are crossed with windows: one plane per seed serves every window), so seed variance
enters the interval; a norm edit uses the document resamples alone. The same resamples serve
every edit, scope and outcome, so comparisons are paired. The dose–response table gives each
(scope, edit, λ or θ) with its dose, n windows, documents and seeds, and mean ΔPPL and KL with
95% percentile intervals.

**Verdict per scope** at the matched dose 1: Δ = KL(norm edit) − KL(rotation), the norm edit
averaged over the λ of dose 1 (0 and 2) per window, the rotation over the seeds of the angle of
dose 1 (60°). Δ > 0 ("holds") says that shrinking or growing v_0 changes the predictions more
than turning it by the same distance. The two scopes form one Holm family
(:func:`geolens.stats.holm_family`: raw and adjusted p, the interval at the pair's Holm level, the
verdict from the interval within the step-down). The same difference for ΔPPL is reported as
exploratory (its own Holm adjustment, no verdict). A scope without any sink head at the edited
layers would equal the clean model: its pair is "not testable". A run whose settings differ from
the protocol is exploratory: every number, no verdict.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from geolens.interventions.sink_values import SinkEditSpec
from geolens.preregistration import NOT_DECIDED
from geolens.sinks.controls_protocol import OUTCOMES, WINDOW_COLUMNS, DoseProtocol, edit_dose
from geolens.stats import bootstrap_indices, cluster_bootstrap_indices, holm_family, percentile_ci, resample_means


def two_stage_means(x, window_draws, seed_draws) -> np.ndarray:
    """Resampled means of ``x`` ``[window, seed]``: resample b is the mean of x[w, s] over the windows
    ``window_draws[b]`` (e.g. :func:`geolens.stats.cluster_bootstrap_indices` of the documents) and
    the seeds ``seed_draws[b]`` (:func:`geolens.stats.bootstrap_indices` over the seeds), ``[B]``.

    >>> x = np.array([[1.0, 3.0], [5.0, 7.0]])
    >>> two_stage_means(x, [np.array([0, 0]), np.array([1, 0])], np.array([[1, 1], [0, 1]])).tolist()
    [3.0, 4.0]
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x must be [window, seed], got shape {x.shape}")
    if len(window_draws) != len(seed_draws):
        raise ValueError(f"{len(window_draws)} window resamples for {len(seed_draws)} seed resamples")
    return np.array([x[np.ix_(np.asarray(w), np.asarray(s))].mean() for w, s in zip(window_draws, seed_draws)])


def _num(x) -> float | None:
    """A float for JSON (None for NaN)."""
    x = float(x)
    return None if math.isnan(x) else x


def dose_summary(
    windows: pd.DataFrame,
    protocol: DoseProtocol = DoseProtocol(),
    *,
    verdicts: bool = True,
    level: float = 0.95,
    not_testable: dict[str, str] | None = None,
) -> dict:
    """The dose–response table and the verdicts, from the per-window table of :func:`geolens.sinks.controls_dose.dose_controls`.

    ``windows`` has the columns of :data:`~geolens.sinks.controls_protocol.WINDOW_COLUMNS`, one row per (window, scope, edit, seed),
    complete (every window under every edit of ``protocol`` in every scope not in
    ``not_testable``, a ``{scope: reason}`` for scopes with nothing to edit). Everything follows
    the module docstring: the resamples are drawn here, from ``protocol.seed``, so that the
    summary recomputes exactly from a saved table. ``verdicts=False`` (an exploratory run): every
    number, and every verdict ``not decided (exploratory)``. Returns a JSON-ready dict:
    ``dose_response`` (records), ``pairs`` (the
    Holm family on KL), ``exploratory_pairs`` (the same on ΔPPL, no verdicts), the sample sizes,
    seeds and bootstrap settings.
    """
    not_testable = dict(not_testable or {})
    missing = [c for c in WINDOW_COLUMNS if c not in windows.columns]
    if missing:
        raise ValueError(f"the windows table lacks the columns {missing}")
    win = windows[["window", "document"]].drop_duplicates().sort_values("window")
    if win.window.duplicated().any():
        raise ValueError("a window of the table belongs to two documents")
    order = {int(w): i for i, w in enumerate(win.window)}
    docs = win.document.to_numpy()
    W, G = len(order), int(len(np.unique(docs)))
    rng = np.random.default_rng(protocol.seed)
    doc_draws = cluster_bootstrap_indices(docs, protocol.n_boot, rng)  # documents with replacement
    seed_draws = {
        a: bootstrap_indices(len(protocol.seeds(a)), protocol.n_boot, rng) for a in protocol.degrees
    }  # then seeds
    groups = {k: g for k, g in windows.groupby(["scope", "edit"])}

    def table(scope: str, kind: str, value: float, outcome: str) -> np.ndarray:
        """``[window]`` (scale) or ``[window, seed]`` (rotate) of ``outcome``, checked complete."""
        g = groups.get((scope, kind))
        col = "lam" if kind == "scale" else "degrees"
        sub = g[g[col] == value] if g is not None else windows.iloc[:0]
        rows = sub.window.map(order).to_numpy()
        if kind == "scale":
            if len(sub) != W or len(set(rows)) != W:
                raise ValueError(f"{scope}, λ = {value:g}: {len(sub)} rows for {W} windows")
            out = np.empty(W)
            out[rows] = sub[outcome].to_numpy(dtype=np.float64)
            return out
        seeds = protocol.seeds(value)
        cols = sub.seed.astype(int).map({s: i for i, s in enumerate(seeds)}).to_numpy()
        if (
            len(sub) != W * len(seeds)
            or np.isnan(cols.astype(float)).any()
            or len(set(zip(rows, cols))) != W * len(seeds)
        ):
            raise ValueError(f"{scope}, {value:g}°: {len(sub)} rows for {W} windows × {len(seeds)} seeds")
        out = np.empty((W, len(seeds)))
        out[rows, cols.astype(int)] = sub[outcome].to_numpy(dtype=np.float64)
        return out

    live = [s for s in protocol.scopes if s not in not_testable]
    stray = sorted(set(windows.scope) - set(live))
    if stray:
        raise ValueError(f"the table holds scopes {stray} that are not tested")
    dose_rows = []
    for scope in live:
        for lam in protocol.lambdas:
            row = dict(
                scope=scope,
                edit="scale",
                lam=lam,
                degrees=None,
                dose=edit_dose(SinkEditSpec("scale", lam)),
                n_windows=W,
                n_documents=G,
                n_seeds=0,
                bootstrap="documents",
            )
            for outcome in OUTCOMES:
                x = table(scope, "scale", lam, outcome)
                lo, hi = percentile_ci(resample_means(x, doc_draws), level)
                row.update({outcome: float(x.mean()), f"{outcome}_low": float(lo), f"{outcome}_high": float(hi)})
            dose_rows.append(row)
        for a in protocol.degrees:
            row = dict(
                scope=scope,
                edit="rotate",
                lam=None,
                degrees=a,
                dose=edit_dose(SinkEditSpec("rotate", degrees=a)),
                n_windows=W,
                n_documents=G,
                n_seeds=len(protocol.seeds(a)),
                bootstrap="documents, then seeds",
            )
            for outcome in OUTCOMES:
                x = table(scope, "rotate", a, outcome)
                lo, hi = percentile_ci(two_stage_means(x, doc_draws, seed_draws[a]), level)
                row.update({outcome: float(x.mean()), f"{outcome}_low": float(lo), f"{outcome}_high": float(hi)})
            dose_rows.append(row)

    def family(outcome: str, decide: bool) -> list[dict]:
        estimates, samples, testable, parts = [], [], [], []
        for scope in protocol.scopes:
            if scope in not_testable:
                estimates.append(float("nan"))
                samples.append(np.array([np.nan]))
                testable.append(False)
                parts.append((None, None))
                continue
            norm = np.mean(
                [table(scope, "scale", lam, outcome) for lam in protocol.matched_lambdas], axis=0
            )  # [window]
            rots = [table(scope, "rotate", a, outcome) for a in protocol.matched_degrees]
            rot_mean = float(np.mean([x.mean() for x in rots]))
            rot_samples = np.mean(
                [two_stage_means(x, doc_draws, seed_draws[a]) for x, a in zip(rots, protocol.matched_degrees)], axis=0
            )
            estimates.append(float(norm.mean()) - rot_mean)
            samples.append(resample_means(norm, doc_draws) - rot_samples)
            testable.append(True)
            parts.append((float(norm.mean()), rot_mean))
        tests = holm_family(estimates, samples, testable=testable, alpha=protocol.alpha)
        out = []
        for scope, t, (norm_mean, rot_mean) in zip(protocol.scopes, tests, parts):
            # an exploratory run (verdicts=False) says so; a pre-registered run's Δppl family keeps None
            verdict = t.verdict if (decide or t.verdict == "not testable") else (None if verdicts else NOT_DECIDED)
            out.append(
                dict(
                    scope=scope,
                    outcome=outcome,
                    statistic=f"{outcome}(norm edit) - {outcome}(rotation) at dose {protocol.matched_dose:g}",
                    lambdas=list(protocol.matched_lambdas),
                    degrees=list(protocol.matched_degrees),
                    norm_edit=norm_mean,
                    rotation=rot_mean,
                    estimate=_num(t.estimate),
                    ci_low=_num(t.ci_low),
                    ci_high=_num(t.ci_high),
                    level=_num(t.level),
                    p=_num(t.p),
                    p_adj=_num(t.p_adj),
                    rank=int(t.rank),
                    holm_stopped_at=int(t.holm_stopped_at),
                    rules_differ=bool(t.rules_differ),
                    verdict=verdict,
                    n_windows=W if scope not in not_testable else 0,
                    n_documents=G if scope not in not_testable else 0,
                    n_seeds=sum(len(protocol.seeds(a)) for a in protocol.matched_degrees),
                    note=not_testable.get(scope),
                )
            )
        return out

    return {
        "n_windows": W,
        "n_documents": G,
        "n_boot": protocol.n_boot,
        "bootstrap_seed": protocol.seed,
        "level": level,
        "alpha": protocol.alpha,
        "multiple_comparison": "holm",
        "bootstrap": "documents with replacement (cluster_bootstrap_indices), then for rotations seeds with replacement, crossed with the windows",
        "seeds": {f"{a:g}": list(protocol.seeds(a)) for a in protocol.degrees},
        "not_testable": not_testable,
        "dose_response": dose_rows,
        "pairs": family("kl", verdicts),
        "exploratory_pairs": family("delta_ppl", False),
    }


__all__ = ["dose_summary", "two_stage_means"]
