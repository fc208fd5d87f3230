"""The statistics of the input-token erasure test (docs/flow/PROTOCOL.md §4-5).

From the per-prediction tables that :func:`geolens.flow.erasure.measure_document` writes:
:func:`naopc_table` (each method's normalised AOPC per prediction, with the range check),
:func:`family_tables` (per-method means and Holm-corrected paired verdicts on one set of
document-cluster resamples), :func:`replacement_differences` (each method's nAOPC under the
robustness replacement minus the primary one, with intervals), :func:`curves_table` (the mean
outcome at each fraction) and :func:`erasure_summary`, which gathers them for a run.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from geolens.flow.baselines import relative_gap
from geolens.flow.erasure import DIRECTIONS, ErasureSettings, erasure_sets, method_pairs
from geolens.stats import cluster_bootstrap_indices, holm_family, mean_ci, percentile_ci, resample_means


def naopc_table(conditions, settings: ErasureSettings):
    """Normalised AOPC per (document, position, replacement, method, direction) (PROTOCOL.md §4).

    Columns ``naopc_kl`` = mean_k KL(k) / KL(all) and ``naopc_dp`` = mean_k D(k) / D(all) with
    D = −Δp, ``aopc_kl`` / ``aopc_dp`` the unnormalised means, ``kl_all`` / ``drop_all`` the full
    erasure's outcomes and ``in_range_kl`` / ``in_range_dp`` the range check (full erasure moves
    KL ≥ ``min_kl_all``, p(t*) down by ≥ ``min_drop_all``). Out-of-range rows keep NaN ratios.
    """
    c = conditions
    full = c[c.method == "all"].set_index(["document", "position", "replacement"])[["kl", "delta_p"]]
    full = full.rename(columns={"kl": "kl_all", "delta_p": "dp_all"})
    parts = c[(c.method != "all") & c.fraction.isin(settings.fractions)].copy()
    parts["drop"] = -parts["delta_p"]
    keys = ["document", "position", "replacement", "method", "direction"]
    grouped = parts.groupby(keys, sort=False)
    n_k = grouped["fraction"].nunique()
    if int(n_k.min()) != len(settings.fractions) or int(n_k.max()) != len(settings.fractions):
        raise ValueError(f"every condition needs the {len(settings.fractions)} fractions {list(settings.fractions)}")
    table = grouped.agg(aopc_kl=("kl", "mean"), aopc_dp=("drop", "mean")).reset_index()
    table = table.join(full, on=["document", "position", "replacement"])
    if table["kl_all"].isna().any():
        raise ValueError("a prediction has no full-erasure condition (method 'all')")
    table["drop_all"] = -table.pop("dp_all")
    table["in_range_kl"] = table["kl_all"] >= settings.min_kl_all
    table["in_range_dp"] = table["drop_all"] >= settings.min_drop_all
    table["naopc_kl"] = np.where(
        table["in_range_kl"], table["aopc_kl"] / table["kl_all"].where(table["in_range_kl"], 1.0), np.nan
    )
    table["naopc_dp"] = np.where(
        table["in_range_dp"], table["aopc_dp"] / table["drop_all"].where(table["in_range_dp"], 1.0), np.nan
    )
    return pd.DataFrame(table)


def identical_by_construction(rankings, settings: ErasureSettings) -> dict[tuple[str, str], bool]:
    """For each pair of methods: True when both erase the same token sets at every prediction and
    fraction of ``rankings`` (then every direction's sets coincide too: a pair that is not testable)."""
    orders = {(r.document, r.position, r.method): [int(v) for v in str(r.order).split()] for r in rankings.itertuples()}
    predictions = sorted({(d, p) for d, p, _ in orders})
    out = {}
    for a, b in method_pairs(settings.methods):
        same = True
        for d, p in predictions:
            oa, ob = orders[(d, p, a)], orders[(d, p, b)]
            sets_a = erasure_sets(oa, settings.fractions, "comprehensiveness")
            sets_b = erasure_sets(ob, settings.fractions, "comprehensiveness")
            if any(set(x) != set(y) for x, y in zip(sets_a, sets_b)):
                same = False
                break
        out[(a, b)] = same
    return out


def _sign(direction: str) -> float:
    """Δ = sign · (S(b) − S(a)): comprehensiveness +1 (larger is better), sufficiency −1."""
    return 1.0 if direction == "comprehensiveness" else -1.0


def _wide(naopc, replacement: str, outcome: str, settings: ErasureSettings):
    """``[prediction, (direction, method)]`` nAOPC of one replacement and outcome, predictions in range only."""
    t = naopc[(naopc.replacement == replacement) & naopc[f"in_range_{'kl' if outcome == 'kl' else 'dp'}"]]
    col = "naopc_kl" if outcome == "kl" else "naopc_dp"
    return t.pivot_table(
        index=["document", "position"], columns=["direction", "method"], values=col, aggfunc="first"
    ).sort_index()


def family_tables(
    naopc, rankings, settings: ErasureSettings, replacement: str, outcome: str, *, verdicts: bool = True
) -> dict:
    """Per-method means and paired differences of one replacement and outcome (PROTOCOL.md §5).

    One set of document-cluster resamples (:func:`geolens.stats.cluster_bootstrap_indices`,
    ``settings.n_boot``, ``settings.boot_seed``) serves every method and pair. ``verdicts``: the
    pairs of both directions form one Holm family (:func:`geolens.stats.holm_family`), a pair
    identical by construction being "not testable"; otherwise (exploratory outcomes) each pair
    gets its 95% interval and no verdict. Returns ``{"methods": [...], "pairs": [...],
    "n_predictions", "n_documents"}``.
    """

    wide = _wide(naopc, replacement, outcome, settings)
    n_pred = int(len(wide))
    docs = wide.index.get_level_values("document").to_numpy()
    out = {
        "replacement": replacement,
        "outcome": outcome,
        "n_predictions": n_pred,
        "n_documents": int(len(set(docs.tolist()))),
        "methods": [],
        "pairs": [],
    }
    if n_pred == 0:
        return out
    idx = cluster_bootstrap_indices(docs, settings.n_boot, settings.boot_seed)
    cols = [(d, m) for d in DIRECTIONS for m in settings.methods]
    est, lo, hi = mean_ci(wide[cols].to_numpy(), indices=idx)  # every method on the same resamples
    for c_i, (d, m) in enumerate(cols):
        out["methods"].append(
            dict(direction=d, method=m, naopc=float(est[c_i]), ci_low=float(lo[c_i]), ci_high=float(hi[c_i]))
        )
    same = identical_by_construction(rankings, settings)
    keys = [(d, a, b) for d in DIRECTIONS for a, b in method_pairs(settings.methods)]
    diffs = np.stack([_sign(d) * (wide[(d, b)].to_numpy() - wide[(d, a)].to_numpy()) for d, a, b in keys], axis=1)
    samples = resample_means(diffs, idx)  # [n_boot, pair]
    tests = [(d, a, b, float(diffs[:, t].mean()), samples[:, t]) for t, (d, a, b) in enumerate(keys)]
    if verdicts:
        results = holm_family(
            [t[3] for t in tests],
            [t[4] for t in tests],
            testable=[not same[(a, b)] for _, a, b, *_ in tests],
            alpha=settings.alpha,
        )
        for (d, a, b, *_), r in zip(tests, results):
            out["pairs"].append(
                dict(
                    direction=d,
                    a=a,
                    b=b,
                    delta=r.estimate,
                    ci_low=r.ci_low,
                    ci_high=r.ci_high,
                    level=r.level,
                    p=r.p,
                    p_adj=r.p_adj,
                    rank=r.rank,
                    verdict=r.verdict,
                    holm_stopped_at=r.holm_stopped_at,
                    rules_differ=r.rules_differ,
                )
            )
    else:
        for d, a, b, delta, boot in tests:
            low, high = percentile_ci(boot, 0.95)
            out["pairs"].append(
                dict(
                    direction=d,
                    a=a,
                    b=b,
                    delta=delta,
                    ci_low=float(low),
                    ci_high=float(high),
                    level=0.95,
                    identical=same[(a, b)],
                )
            )
    return out


def most_faithful(pairs: Sequence[dict], methods: Sequence[str], direction: str) -> dict | None:
    """The method whose pairs with every other method are decided in its favour in ``direction``
    (holds as b, reversed as a), with its smallest margin: ``{"method", "by", "ci_low",
    "ci_high", "against"}`` (``by`` in the method's favour); None when no method qualifies."""
    rows = [p for p in pairs if p["direction"] == direction]
    for m in methods:
        margins = []
        for p in rows:
            if m == p["b"] and p["verdict"] == "holds":
                margins.append((p["delta"], p["ci_low"], p["ci_high"], p["a"]))
            elif m == p["a"] and p["verdict"] == "reversed":
                margins.append((-p["delta"], -p["ci_high"], -p["ci_low"], p["b"]))
        if len(margins) == len(methods) - 1:
            by, lo, hi, other = min(margins)
            return dict(method=m, by=float(by), ci_low=float(lo), ci_high=float(hi), against=other)
    return None


def curves_table(conditions, settings: ErasureSettings):
    """Mean KL and Δp at each fraction per (replacement, method, direction), with 95%
    document-cluster intervals (one set of resamples for every curve: each prediction has every
    condition)."""

    c = conditions[conditions.method != "all"]
    keys = ["replacement", "method", "direction", "fraction"]
    wide = {
        v: c.pivot_table(index=["document", "position"], columns=keys, values=v, aggfunc="first").sort_index()
        for v in ("kl", "delta_p")
    }
    if wide["kl"].isna().any().any():
        raise ValueError("every prediction needs every condition for the curves")
    idx = cluster_bootstrap_indices(
        wide["kl"].index.get_level_values("document").to_numpy(), settings.n_boot, settings.boot_seed
    )
    kl = mean_ci(wide["kl"].to_numpy(), indices=idx)  # every column on the same resamples, in one pass
    dp = mean_ci(wide["delta_p"].to_numpy(), indices=idx)
    rows = []
    for c_i, col in enumerate(wide["kl"].columns):
        rows.append(
            dict(
                zip(keys, col),
                n=int(len(wide["kl"])),
                kl=float(kl[0][c_i]),
                kl_low=float(kl[1][c_i]),
                kl_high=float(kl[2][c_i]),
                delta_p=float(dp[0][c_i]),
                delta_p_low=float(dp[1][c_i]),
                delta_p_high=float(dp[2][c_i]),
            )
        )
    return pd.DataFrame(rows)


def replacement_differences(naopc, settings: ErasureSettings, outcome: str = "kl") -> dict:
    """How much each method's nAOPC moves between the two replacements: the paired difference
    robustness − primary (e.g. unigram − space) of its mean nAOPC, per direction and method, over the
    predictions in range under both replacements (the range check of either excludes it).

    One set of document-cluster resamples (:func:`geolens.stats.cluster_bootstrap_indices`) serves
    every test; the tests of both directions form one Holm family (:func:`geolens.stats.holm_family`),
    each with its interval at its Holm level and ``excludes_zero`` when the step-down decided it.
    The protocol pre-registers no decision rule for this comparison (no margin; PROTOCOL.md §5 only
    lists the pairs whose verdict differs), so these intervals decide nothing: the claim about
    robustness to the replacement that reads them is indicative. Returns ``{"primary",
    "robustness", "outcome", "n_predictions", "n_documents", "tests": [...]}`` (no tests when no
    prediction is in range under both, or with one replacement).
    """

    key = "kl" if outcome == "kl" else "dp"
    second = settings.replacements[1] if len(settings.replacements) > 1 else None
    out = {
        "primary": settings.replacements[0],
        "robustness": second,
        "outcome": outcome,
        "n_predictions": 0,
        "n_documents": 0,
        "tests": [],
    }
    if second is None:
        return out
    first = settings.primary
    t = naopc[naopc.replacement.isin([first, second]) & naopc[f"in_range_{key}"]]
    wide = t.pivot_table(
        index=["document", "position"],
        columns=["replacement", "direction", "method"],
        values=f"naopc_{key}",
        aggfunc="first",
    )
    cols = [(r, d, m) for r in (first, second) for d in DIRECTIONS for m in settings.methods]
    wide = (
        wide.reindex(columns=pd.MultiIndex.from_tuples(cols)).dropna().sort_index()
    )  # in range under both replacements
    docs = wide.index.get_level_values("document").to_numpy()
    out.update(n_predictions=int(len(wide)), n_documents=int(len(set(docs.tolist()))))
    if len(wide) == 0:
        return out
    keys = [(d, m) for d in DIRECTIONS for m in settings.methods]
    base = np.stack([wide[(first, d, m)].to_numpy() for d, m in keys], axis=1)
    other = np.stack([wide[(second, d, m)].to_numpy() for d, m in keys], axis=1)
    diffs = other - base
    samples = resample_means(
        diffs, cluster_bootstrap_indices(docs, settings.n_boot, settings.boot_seed)
    )  # [n_boot, test]
    results = holm_family(diffs.mean(0), samples.T, alpha=settings.alpha)
    for (d, m), b, o, r in zip(keys, base.mean(0), other.mean(0), results):
        out["tests"].append(
            dict(
                direction=d,
                method=m,
                naopc_primary=float(b),
                naopc_robustness=float(o),
                delta=r.estimate,
                ci_low=r.ci_low,
                ci_high=r.ci_high,
                level=r.level,
                p=r.p,
                p_adj=r.p_adj,
                rank=r.rank,
                excludes_zero=r.verdict in ("holds", "reversed"),
            )
        )
    return out


def verdict_changes(primary: Sequence[dict], robustness: Sequence[dict]) -> list[dict]:
    """Pairs whose verdict differs between the two families (same direction and pair)."""
    other = {(p["direction"], p["a"], p["b"]): p["verdict"] for p in robustness}
    return [
        dict(
            direction=p["direction"],
            a=p["a"],
            b=p["b"],
            primary=p["verdict"],
            robustness=other[(p["direction"], p["a"], p["b"])],
        )
        for p in primary
        if (p["direction"], p["a"], p["b"]) in other and other[(p["direction"], p["a"], p["b"])] != p["verdict"]
    ]


def erasure_summary(tables: dict, settings: ErasureSettings) -> dict:
    """The statistics of a run (PROTOCOL.md §4–5) from its ``conditions``, ``predictions`` and
    ``rankings`` tables: range check, per-method nAOPC, the primary and robustness families
    (KL), the exploratory Δp comparisons, verdict changes between replacements and each method's
    nAOPC difference between them (:func:`replacement_differences`), the most faithful
    method per direction and integrated gradients' completeness gaps."""
    conditions, predictions, rankings = tables["conditions"], tables["predictions"], tables["rankings"]
    naopc = naopc_table(conditions, settings)
    full = naopc.drop_duplicates(["document", "position", "replacement"])
    range_check = {
        r: dict(
            n_predictions=int((full.replacement == r).sum()),
            excluded_kl=int(((full.replacement == r) & ~full.in_range_kl).sum()),
            excluded_dp=int(((full.replacement == r) & ~full.in_range_dp).sum()),
        )
        for r in settings.replacements
    }
    families = {}
    for role, r in zip(("primary", "robustness"), settings.replacements):
        families[role] = family_tables(naopc, rankings, settings, r, "kl", verdicts=True)
    exploratory = {
        r: family_tables(naopc, rankings, settings, r, "delta_p", verdicts=False) for r in settings.replacements
    }
    out = dict(
        n_documents=int(predictions["document"].nunique()),
        n_predictions=int(len(predictions)),
        multiple_comparison="holm",
        range_check=range_check,
        families=families,
        exploratory_delta_p=exploratory,
        most_faithful={d: most_faithful(families["primary"]["pairs"], settings.methods, d) for d in DIRECTIONS},
    )
    if "robustness" in families:
        out["verdict_changes"] = verdict_changes(families["primary"]["pairs"], families["robustness"]["pairs"])
        out["replacement_differences"] = replacement_differences(naopc, settings, "kl")
    if "integrated_gradients" in settings.methods and len(predictions):
        delta = predictions["ig_f_input"] - predictions["ig_f_baseline"]
        gap = (predictions["ig_sum"] - delta).abs()
        rel = gap / delta.abs().clip(lower=1e-12)
        out["ig_completeness"] = dict(
            median_abs_gap=float(gap.median()),
            max_abs_gap=float(gap.max()),
            median_rel_gap=float(rel.median()),
            share_rel_gap_within_5pct=float((rel <= 0.05).mean()),
            n_steps=int(settings.ig_steps),
        )
        if settings.ig_tolerance is not None:  # docs/flow/v2: adaptive steps, the stopping rule's gap
            rule = relative_gap(predictions["ig_sum"], predictions["ig_f_input"], predictions["ig_f_baseline"])
            steps = predictions["ig_steps"]
            out["ig_completeness"].update(
                rule=(
                    "|gap| / max(|f(x) - f(x')|, 0.01), steps tripled from n_steps up to max_steps"
                    if settings.ig_grid == "even"
                    else "|gap| / max(|f(x) - f(x')|, 0.01), n_steps even intervals, then the intervals with the "
                    "largest local completeness error split in three, up to max_steps gradients"
                ),
                tolerance=float(settings.ig_tolerance),
                max_steps=int(settings.ig_max_steps),
                share_rel_gap_within_1pct=float((rule <= 0.01).mean()),
                share_within_tolerance=float((rule <= settings.ig_tolerance).mean()),
                median_steps=float(steps.median()),
                max_steps_used=int(steps.max()),
            )
            if settings.ig_grid == "even":
                counts = steps.value_counts().sort_index()
                out["ig_completeness"]["steps_used"] = {str(int(k)): int(v) for k, v in counts.items()}
            else:  # docs/flow/v3: any number of steps; the grid and the forward passes at its ends
                out["ig_completeness"].update(
                    grid="local",
                    steps_quantiles={q: float(steps.quantile(v)) for q, v in (("p10", 0.1), ("p90", 0.9))},
                    total_gradients=int(steps.sum()),
                    total_forward=int(predictions["ig_forward"].sum()),
                )
    return out


__all__ = ["curves_table", "erasure_summary", "family_tables", "naopc_table", "replacement_differences"]
