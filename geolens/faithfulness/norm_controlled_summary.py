"""The summary of protocol 3's per-term endpoint (docs/faithfulness/v3/PROTOCOL.md §5-7, §10).

:func:`norm_controlled_summary` turns a run's ``terms`` and ``positions`` tables into per-metric
means of each analysis (:func:`geolens.faithfulness.norm_controlled_stats.statistics_table`) with
document-cluster bootstrap intervals, the pre-registered pairs of the primary statistic as one
Holm family (:func:`geolens.stats.holm_family`), the exploratory analyses, the per-layer and
per-third means and the numerical floors; the README renders it
(:mod:`geolens.pipelines.norm_controlled_text`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.faithfulness.ground_truth import TERM_METRICS
from geolens.faithfulness.norm_controlled_stats import statistics_table
from geolens.stats import cluster_bootstrap_indices, holm_family, nan_to_none, percentile_ci, resample_means


def _means(table: pd.DataFrame, clusters, n_boot: int, seed: int):
    """Per-metric means of ``table`` (positions × metrics, no NaN) and their bootstrap samples."""
    indices = cluster_bootstrap_indices(clusters, n_boot, seed)
    return table.mean().to_numpy(), resample_means(table.to_numpy(), indices)


def _metric_entries(table: pd.DataFrame, boot: np.ndarray, n_excluded: int, extra: dict | None = None) -> list[dict]:
    lo, hi = percentile_ci(boot, 0.95)
    docs = table.index.get_level_values("document")
    return [
        dict(
            **(extra or {}),
            metric=m,
            mean=float(table[m].mean()),
            ci_low=float(lo[k]),
            ci_high=float(hi[k]),
            n_positions=int(len(table)),
            n_documents=int(docs.nunique()),
            n_excluded_positions=int(n_excluded),
        )
        for k, m in enumerate(table.columns)
    ]


def _pivot(stats: pd.DataFrame, analysis: str) -> tuple[pd.DataFrame, int]:
    part = stats[stats.analysis == analysis]
    table = part.pivot(index=["document", "position"], columns="metric", values="value")
    table = table[[m for m in TERM_METRICS if m in table.columns]]
    kept = table.dropna(how="any")
    return kept, int(len(table) - len(kept))


def norm_controlled_summary(
    terms: pd.DataFrame | None, positions: pd.DataFrame, settings: dict, *, stats=None, family_only: bool = False
) -> dict:
    """``per_term_effects`` of a protocol-3 run (PROTOCOL.md §5-7, §10) from its ``terms`` and
    ``positions`` tables and the protocol's twin ``settings``. ``stats``: the positions'
    :func:`~geolens.faithfulness.norm_controlled_stats.statistics_table`, when already computed
    (``terms`` may then be None); ``family_only``: only ``{"pairs": ...}``, the primary Holm family
    (what :mod:`geolens.stability` recomputes for each leave-out)."""
    st = settings["statistics"]
    n_boot, seed, alpha = int(st["n_boot"]), int(st["seed"]), float(st["alpha"])
    factor = float(settings["numerical_floor"]["resolvable_factor"])
    pairs = [tuple(p) for p in settings["pairs"]]
    if stats is None:
        stats = statistics_table(terms, positions, resolvable_factor=factor)

    # primary: the partial Spearman given the norm, one Holm family
    table, n_excl = _pivot(stats, "norm_controlled")
    docs = table.index.get_level_values("document").to_numpy()
    _, boot = _means(table, docs, n_boot, seed)
    columns = list(table.columns)
    zero = set(settings["primary"].get("zero_by_construction", []))
    tests, entries = [], []
    for a, b in pairs:
        ka, kb = columns.index(a), columns.index(b)
        both_zero = a in zero and b in zero
        entry = dict(endpoint="per_term_norm_controlled", outcome="kl", a=a, b=b, n_positions=int(len(table)))
        entry["n_documents"] = int(len(np.unique(docs)))
        tests.append((float(table[b].mean() - table[a].mean()), boot[:, kb] - boot[:, ka], not both_zero))
        entries.append(entry)
    decided = holm_family([t[0] for t in tests], [t[1] for t in tests], testable=[t[2] for t in tests], alpha=alpha)
    family = []
    for entry, result in zip(entries, decided):
        values = nan_to_none(result._asdict())
        family.append(dict(entry, **values))
    if family_only:
        return dict(pairs=family)
    not_testable = [
        dict(a=e["pair"][0], b=e["pair"][1], verdict="not testable", why=e["why"])
        for e in settings.get("not_testable_by_construction", [])
    ]
    claimed = [family[i] for i in settings.get("claimed_order_pairs", [])]
    verdicts = [p["verdict"] for p in claimed]
    norm_controlled = dict(
        statistic="mean over positions of the partial Spearman correlation with the KL given ||alpha v~||",
        metrics=_metric_entries(table, boot, n_excl),
        zero_by_construction=sorted(zero),
        pairs=family,
        not_testable=not_testable,
        not_formed=settings.get("not_formed", []),
        claimed_order_beyond_norm=(
            "holds" if verdicts and all(v == "holds" for v in verdicts) else "does not hold" if verdicts else None
        ),
        n_boot=n_boot,
        seed=seed,
        multiple_comparison="holm",
    )

    def exploratory(analysis: str, with_pairs: bool = False) -> dict:
        t, excl = _pivot(stats, analysis)
        if t.empty:
            return dict(metrics=[], n_positions=0, n_excluded_positions=excl)
        d = t.index.get_level_values("document").to_numpy()
        _, b = _means(t, d, n_boot, seed)
        out = dict(metrics=_metric_entries(t, b, excl), n_positions=int(len(t)), n_excluded_positions=excl)
        if with_pairs:
            cols = list(t.columns)
            out["pairs"] = []
            for a, bb in pairs:
                delta = b[:, cols.index(bb)] - b[:, cols.index(a)]
                lo, hi = percentile_ci(delta, 0.95)
                out["pairs"].append(
                    dict(a=a, b=bb, estimate=float(t[bb].mean() - t[a].mean()), ci_low=float(lo), ci_high=float(hi))
                )
            out["note"] = "exploratory: 95% CIs, no family, no verdict"
        return out

    share = (
        terms.kl.to_numpy() >= factor * terms.merge(positions, on=["document", "position"]).floor.to_numpy()
    ).mean()
    resolvable = {
        "factor": factor,
        "share_of_terms": float(share),
        "n_terms": int(len(terms)),
        "partial": exploratory("resolvable_partial"),
        "plain": exploratory("resolvable_plain"),
    }
    per_layer = _per_layer(stats, n_boot, seed, int(positions.layer.max()) + 1 if len(positions) else 0, settings)
    floors = positions.floor.to_numpy(np.float64)
    q = np.quantile(floors, [0.0, 0.5, 0.9, 1.0]) if len(floors) else [np.nan] * 4
    return dict(
        outcome="kl",
        effects_dtype="float64",
        n_positions=int(len(positions)),
        n_documents=int(positions.document.nunique()),
        n_terms=int(len(terms)),
        norm_controlled=norm_controlled,
        pairs=family,
        plain=exploratory("plain", with_pairs=True),
        strata=exploratory("strata"),
        resolvable=resolvable,
        top_decile=dict(partial=exploratory("top_decile_partial"), plain=exploratory("top_decile_plain")),
        signed=dict(
            outcome="-delta_logp_next (the drop of log p of the actual next token)",
            partial=exploratory("signed_partial"),
            plain=exploratory("signed_plain"),
            magnitude=dict(partial=exploratory("magnitude_partial"), plain=exploratory("magnitude_plain")),
        ),
        per_layer=per_layer,
        numerical_floor=dict(
            definition=settings["numerical_floor"]["kl"],
            kl_floor_min=float(q[0]),
            kl_floor_median=float(q[1]),
            kl_floor_p90=float(q[2]),
            kl_floor_max=float(q[3]),
            reference_kl_max=float(positions.reference_kl.max()) if len(positions) else None,
            delta_logp_next_floor_median=float(positions.floor_delta_logp_next.median()) if len(positions) else None,
            kl_min_median=float(positions.kl_min.median()) if len(positions) else None,
            kl_max_median=float(positions.kl_max.median()) if len(positions) else None,
        ),
    )


def _per_layer(stats: pd.DataFrame, n_boot: int, seed: int, n_layers: int, settings: dict) -> dict:
    """The mean partial per metric per layer and per third of the stack, bootstrap over the
    (document, layer) clusters of each group (exploratory)."""
    table, _ = _pivot(stats, "norm_controlled")
    layer_of = stats[stats.analysis == "norm_controlled"].groupby(["document", "position"]).layer.first()
    layers = layer_of.reindex(table.index).to_numpy()
    n_layers = max(n_layers, int(settings.get("n_layers", 0)))
    groups = {f"layer {l}": layers == l for l in sorted(set(layers.tolist()))}
    third, two = n_layers // 3, (2 * n_layers) // 3
    groups.update(
        {
            f"layers 0-{third - 1}": layers < third,
            f"layers {third}-{two - 1}": (layers >= third) & (layers < two),
            f"layers {two}-{n_layers - 1}": layers >= two,
        }
    )
    out = []
    docs = table.index.get_level_values("document").to_numpy()
    for name, keep in groups.items():
        if keep.sum() == 0:
            continue
        sub = table[keep]
        clusters = [f"{d}/{l}" for d, l in zip(docs[keep], layers[keep])]
        _, boot = _means(sub, clusters, n_boot, seed)
        out += _metric_entries(sub, boot, 0, dict(group=name))
    return dict(statistic="partial Spearman with the KL given the norm", groups=out)
