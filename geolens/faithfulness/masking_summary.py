"""The statistics of the per-layer masking endpoint (docs/faithfulness/PROTOCOL.md §3-4).

:func:`masking_summary` turns the rows that :func:`geolens.faithfulness.layer_masking.layer_masking_document`
measured on all documents into normalised AOPC, the range and ceiling checks, per-metric means with
document bootstrap CIs and the pre-registered pairs as one Holm family (:func:`geolens.stats.holm_family`);
the Δp nAOPC, the per-k curves and the per-layer means come beside them as exploratory results.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.faithfulness.layer_masking import ALL_REMOVED, DIRECTIONS, SECTION_2_ONLY
from geolens.stats import cluster_bootstrap_indices, holm_family, mean_ci, nan_to_none, percentile_ci, resample_means

MIN_DELTA_P_ALL_REMOVED = 1e-3  # exploratory Δp nAOPC: |Δp(all removed)| below this is no denominator


def _check_rows(rows: pd.DataFrame) -> None:
    missing = [
        c
        for c in ("document", "layer", "metric", "direction", "k", "kl", "delta_p", "nll", "unigram_ce", "mask_hash")
        if c not in rows.columns
    ]
    if missing:
        raise ValueError(f"masking rows lack the columns {missing} (layer_masking_document writes them)")
    if rows.empty:
        raise ValueError("no masking rows to summarise")


def _exclusions(rows: pd.DataFrame, min_kl: float) -> tuple[pd.DataFrame, dict, dict]:
    """Per (document, layer): the all-removed KL and Δp and the exclusions; the range and ceiling
    check reports."""
    all_removed = rows[rows.metric == ALL_REMOVED]
    counts = all_removed.groupby(["document", "layer"]).size()
    doc_layers = rows[["document", "layer"]].drop_duplicates().set_index(["document", "layer"]).index
    if len(counts) != len(doc_layers) or (counts != 1).any():
        raise ValueError("every (document, layer) needs exactly one all-removed row")
    table = all_removed.set_index(["document", "layer"])[["kl", "delta_p"]].rename(
        columns={"kl": "kl_all", "delta_p": "delta_p_all"}
    )
    table["range_excluded"] = table.kl_all < min_kl
    checked = rows.unigram_ce.notna()
    off = checked & (rows.nll > rows.unigram_ce)
    per = rows.assign(off=off, checked=checked).groupby(["document", "layer"])
    table["ceiling_excluded"] = per.off.any().reindex(table.index)
    table["ceiling_checked"] = per.checked.all().reindex(table.index)
    table["excluded"] = table.range_excluded | table.ceiling_excluded
    n_cond = int(len(rows))
    excluded_conditions = int(
        rows.set_index(["document", "layer"]).index.isin(table.index[table.ceiling_excluded]).sum()
    )
    range_check = dict(
        min_kl_all_removed=float(min_kl),
        n_document_layers=int(len(table)),
        n_document_layers_excluded=int(table.range_excluded.sum()),
        excluded=[[int(d), int(l)] for d, l in table.index[table.range_excluded]],
    )
    ceiling = dict(
        rule="masked mean NLL of the actual next tokens > their corpus unigram cross-entropy",
        n_conditions=n_cond,
        n_conditions_checked=int(checked.sum()),
        n_off_distribution=int(off.sum()),
        share=float(off.sum()) / n_cond,
        n_all_removed_off_distribution=int(off[rows.metric == ALL_REMOVED].sum()),
        n_document_layers_excluded=int(table.ceiling_excluded.sum()),
        n_conditions_excluded=excluded_conditions,
        share_conditions_excluded=excluded_conditions / n_cond,
        excluded=[[int(d), int(l)] for d, l in table.index[table.ceiling_excluded]],
    )
    if not bool(checked.all()):
        ceiling["note"] = "conditions without a unigram cross-entropy were not checked"
    return table, range_check, ceiling


def _naopc(kept: pd.DataFrame, table: pd.DataFrame, outcome: str, fractions: list[float]) -> pd.DataFrame:
    """nAOPC per (document, layer, metric, direction): mean over k of outcome(k) / outcome(all removed)."""
    denominator = table[f"{outcome}_all"]
    grid = kept.pivot_table(
        index=["document", "layer", "metric", "direction"], columns="k", values=outcome, aggfunc="first"
    )
    missing = [k for k in fractions if k not in grid.columns]
    if missing or grid[fractions].isna().any().any():
        raise ValueError(f"some (document, layer, metric, direction) lack fractions of the grid {fractions}")
    groups = grid.groupby(level=["document", "layer"]).size()
    if (groups != groups.max()).any():
        raise ValueError(
            "some (document, layer) lack conditions of a metric or direction that others have: the comparison must be paired"
        )
    ratio = grid[fractions].div(denominator.reindex(grid.index.droplevel(["metric", "direction"])).to_numpy(), axis=0)
    return ratio


def _per_document(values: pd.Series) -> pd.DataFrame:
    """Documents × (direction, metric): the mean over each document's remaining layers."""
    return values.groupby(["document", "direction", "metric"]).mean().unstack(["direction", "metric"])


def _pair_list(protocol, present: set[str]) -> tuple[list[tuple[str, str]], list[dict]]:
    formed, not_formed = [], []
    for a, b in protocol["pairs"]:
        if a in SECTION_2_ONLY or b in SECTION_2_ONLY:
            continue
        if a in present and b in present:
            formed.append((a, b))
        else:
            not_formed.append(dict(a=a, b=b, why=f"no masking rows of {[m for m in (a, b) if m not in present]}"))
    return formed, not_formed


def _pair_differences(per_doc: pd.DataFrame, boot: np.ndarray, formed, directions):
    """(direction, a, b, Δ per document, Δ per bootstrap resample) of each pair in each direction,
    signed so that Δ > 0 means b more faithful (S(b) − S(a) for comprehensiveness, S(a) − S(b) for
    sufficiency); both Δ are None when a metric has no rows in that direction."""
    columns = list(per_doc.columns)
    for direction in directions:
        sign = 1.0 if direction == "comprehensiveness" else -1.0
        for a, b in formed:
            if (direction, a) not in columns or (direction, b) not in columns:
                yield direction, a, b, None, None
                continue
            ca, cb = columns.index((direction, a)), columns.index((direction, b))
            yield (
                direction,
                a,
                b,
                sign * (per_doc.iloc[:, cb] - per_doc.iloc[:, ca]),
                sign * (boot[:, cb] - boot[:, ca]),
            )


def _pair_family(
    per_doc, boot, hashes, formed, not_formed, directions, alpha: float, outcome: str, drop=()
) -> list[dict]:
    """The pre-registered pairs of both directions as one Holm family: Δ = S(b) − S(a) for
    comprehensiveness, S(a) − S(b) for sufficiency (Δ > 0: b more faithful), "not testable" when
    the two metrics' masks are identical in every condition of the direction. A pair whose metric
    has no rows in a direction is appended to ``not_formed``; a test named in ``drop`` as
    ``(a, b, direction)`` (a comparison already in the family) is left out of it and listed there."""
    tests = []
    drop = {tuple(t) for t in drop}
    for direction, a, b, delta, samples in _pair_differences(per_doc, boot, formed, directions):
        if delta is None:
            not_formed.append(dict(a=a, b=b, direction=direction, why="a metric has no rows in this direction"))
            continue
        if (a, b, direction) in drop:
            not_formed.append(
                dict(a=a, b=b, direction=direction, why="the same comparison as another test of the family")
            )
            continue
        ha = hashes.xs((a, direction), level=("metric", "direction"))
        hb = hashes.xs((b, direction), level=("metric", "direction")).reindex(ha.index)
        entry = dict(endpoint="masking", outcome=outcome, direction=direction, a=a, b=b, n_documents=int(len(per_doc)))
        tests.append((entry, float(delta.mean()), samples, not bool((ha == hb).all())))
    decided = holm_family([t[1] for t in tests], [t[2] for t in tests], testable=[t[3] for t in tests], alpha=alpha)
    return [nan_to_none(dict(entry, **result._asdict())) for (entry, *_), result in zip(tests, decided)]


def masking_summary(
    rows: pd.DataFrame, protocol, *, n_boot: int | None = None, seed: int | None = None, family_only: bool = False
) -> dict:
    """Normalised AOPC, the range and ceiling checks, per-metric means and the pre-registered pairs
    of the masking endpoint (PROTOCOL.md §3–4) from :func:`layer_masking_document`'s rows of all
    documents.

    - **nAOPC** of (document d, layer l, metric m, direction): mean over the k grid of KL(k),
      divided by KL(all removed) of (d, l).
    - **Range check**: a (d, l) whose all-removed KL is below ``secondary.range_check_min_kl_all_removed``
      is excluded from every metric (``range_check``).
    - **Ceiling check**: a condition is off-distribution when its masked mean NLL exceeds the
      unigram cross-entropy of the same next tokens; a (d, l) with any off-distribution condition
      (the all-removed one included) is excluded from every metric (``ceiling_check``: the counts,
      ``share`` = off-distribution conditions / conditions, and the conditions excluded with
      their (d, l)). Rows without a unigram cross-entropy are not checked.
    - **Per document**: the mean nAOPC over its remaining layers; documents left with no layer
      drop out (counted). **Per metric and direction**: the mean over documents with a 95%
      percentile CI from the document bootstrap (``statistics.n_boot`` resamples of the documents,
      ``statistics.seed``; :func:`geolens.stats.cluster_bootstrap_indices`, one value per
      document), the same resamples for every metric, direction and pair.
    - **Pairs** a → b of ``protocol["pairs"]`` (those with gradient × activation belong to the
      per-term endpoint), in each direction: Δ = S(b) − S(a) for comprehensiveness (more damage
      from the top terms is better) and S(a) − S(b) for sufficiency (less damage from the bottom
      terms is better), so Δ > 0 always means b is more faithful; all pairs of both directions
      form one Holm family (:func:`geolens.stats.holm_family`, α = ``statistics.alpha``). A pair
      whose two metrics have identical masks (equal ``mask_hash``) in every (d, l, k) of a
      direction used is "not testable" and left out of the family.
    - **Exploratory**, outside the family, 95% CIs: the Δp nAOPC (mean over k of Δp(k) /
      Δp(all removed); a (d, l) with |Δp(all removed)| < :data:`MIN_DELTA_P_ALL_REMOVED` is left
      out of it, besides the exclusions above) with its pairs, the per-k normalised KL
      (KL(k)/KL(all removed)) of each metric with the per-k pair differences, and the per-layer
      means of the nAOPC.

    ``n_boot`` and ``seed`` override the protocol's (for tests and exploratory runs);
    ``family_only``: only ``{"pairs": ...}``, the Holm family (what :mod:`geolens.stability`
    recomputes for each leave-out).
    """
    _check_rows(rows)
    second = protocol["secondary"]
    stats = protocol["statistics"]
    n_boot = int(stats["n_boot"]) if n_boot is None else int(n_boot)
    seed = int(stats["seed"]) if seed is None else int(seed)
    alpha = float(stats.get("alpha", 0.05))
    fractions = [float(k) for k in second["fractions"]]
    directions = [d for d in DIRECTIONS if d in set(rows.direction)]
    table, range_check, ceiling = _exclusions(rows, float(second["range_check_min_kl_all_removed"]))
    used = table.index[~table.excluded]
    conditions = rows[rows.metric != ALL_REMOVED]
    index = conditions.set_index(["document", "layer"]).index
    kept = conditions[index.isin(used)]
    all_documents = sorted(set(rows.document))
    design = dict(
        endpoint="normalized_aopc",
        outcome="kl",
        masking_scope="layer",
        ranking_scope="query",
        fractions=fractions,
        directions=directions,
        n_document_layers=int(len(table)),
        range_check=range_check,
        ceiling_check=ceiling,
        multiple_comparison="holm",
        alpha=alpha,
        n_boot=n_boot,
        seed=seed,
    )
    if kept.empty:  # nothing to compare: the checks are the result, and no pair is formed
        return dict(
            design,
            n_documents=0,
            n_documents_without_layers=len(all_documents),
            n_document_layers_used=0,
            metrics=[],
            pairs=[],
            note=f"no (document, layer) is left after the range check ({range_check['n_document_layers_excluded']} excluded) "
            f"and the ceiling check ({ceiling['n_document_layers_excluded']} excluded): nothing to compare",
        )
    present = set(kept.metric)
    naopc = _naopc(kept, table, "kl", fractions)
    per_doc = _per_document(naopc.mean(axis=1))
    documents = per_doc.index.to_numpy()
    indices = cluster_bootstrap_indices(documents, n_boot, seed)
    boot = resample_means(per_doc.to_numpy(), indices)  # [n_boot, columns]
    columns = list(per_doc.columns)
    lo, hi = percentile_ci(boot, 0.95)
    metrics_out = []
    for c, (direction, metric) in enumerate(columns):
        metrics_out.append(
            dict(
                direction=direction,
                metric=metric,
                naopc=float(per_doc.iloc[:, c].mean()),
                ci_low=float(lo[c]),
                ci_high=float(hi[c]),
                n_documents=int(len(per_doc)),
                n_document_layers=int(naopc.xs((metric, direction), level=("metric", "direction")).shape[0]),
            )
        )

    formed, not_formed = _pair_list(protocol, present)
    hashes = kept.set_index(["document", "layer", "metric", "direction", "k"]).mask_hash
    pairs = _pair_family(per_doc, boot, hashes, formed, not_formed, directions, alpha, "kl")
    if family_only:
        return dict(pairs=pairs)

    exploratory = dict(
        note="exploratory: 95% CIs on the same document resamples, outside the Holm family",
        delta_p=_delta_p_summary(kept, table, fractions, formed, directions, documents, indices),
        per_k=_per_k(kept, table, fractions, formed, directions, documents, indices),
        per_layer=_per_layer(naopc, n_boot, seed),
    )
    return dict(
        design,
        secondary_outcome="delta_p",
        n_documents=int(len(per_doc)),
        n_documents_without_layers=int(len(all_documents) - len(per_doc)),
        n_document_layers_used=int(len(used)),
        metrics=metrics_out,
        pairs=pairs,
        pairs_not_formed=not_formed,
        exploratory=exploratory,
    )


def _pair_intervals(
    per_doc: pd.DataFrame, boot: np.ndarray, formed, directions, extra: dict | None = None
) -> list[dict]:
    """95% CIs of the exploratory pair differences (Δ > 0: b better), on given resamples."""
    out = []
    for direction, a, b, delta, samples in _pair_differences(per_doc, boot, formed, directions):
        if delta is None:
            continue
        lo, hi = percentile_ci(samples, 0.95, omit_nan=True)
        out.append(
            nan_to_none(
                dict(
                    direction=direction,
                    a=a,
                    b=b,
                    **(extra or {}),
                    estimate=float(delta.mean()),
                    ci_low=float(lo),
                    ci_high=float(hi),
                    n_documents=int(delta.notna().sum()),
                )
            )
        )
    return out


def _delta_p_summary(kept, table, fractions, formed, directions, documents, indices) -> dict:
    usable = table.index[~table.excluded & (table.delta_p_all.abs() >= MIN_DELTA_P_ALL_REMOVED)]
    part = kept[kept.set_index(["document", "layer"]).index.isin(usable)]
    n_left_out = int((~table.excluded).sum() - len(usable))
    if part.empty:
        return dict(
            metrics=[],
            pairs=[],
            min_abs_delta_p_all_removed=MIN_DELTA_P_ALL_REMOVED,
            n_document_layers_left_out=n_left_out,
        )
    per_doc = _per_document(_naopc(part, table, "delta_p", fractions).mean(axis=1)).reindex(documents)
    boot = resample_means(per_doc.to_numpy(), indices, omit_nan=True)
    lo, hi = percentile_ci(boot, 0.95, omit_nan=True)
    metrics = [
        nan_to_none(
            dict(
                direction=d,
                metric=m,
                naopc=float(per_doc.iloc[:, c].mean()),
                ci_low=float(lo[c]),
                ci_high=float(hi[c]),
                n_documents=int(per_doc.iloc[:, c].notna().sum()),
            )
        )
        for c, (d, m) in enumerate(per_doc.columns)
    ]
    return dict(
        metrics=metrics,
        pairs=_pair_intervals(per_doc, boot, formed, directions),
        min_abs_delta_p_all_removed=MIN_DELTA_P_ALL_REMOVED,
        n_document_layers_left_out=n_left_out,
    )


def _per_k(kept, table, fractions, formed, directions, documents, indices) -> dict:
    ratio = _naopc(kept, table, "kl", fractions)  # [(d, l, m, dir), k]
    metrics, pairs = [], []
    for k in fractions:
        per_doc = _per_document(ratio[k]).reindex(documents)
        boot = resample_means(per_doc.to_numpy(), indices)
        lo, hi = percentile_ci(boot, 0.95)
        for c, (d, m) in enumerate(per_doc.columns):
            metrics.append(
                dict(
                    direction=d,
                    metric=m,
                    k=k,
                    normalized_kl=float(per_doc.iloc[:, c].mean()),
                    ci_low=float(lo[c]),
                    ci_high=float(hi[c]),
                )
            )
        pairs += _pair_intervals(per_doc, boot, formed, directions, extra=dict(k=k))
    return dict(metrics=metrics, pairs=pairs)


def _per_layer(naopc: pd.DataFrame, n_boot: int, seed: int, name: str = "naopc") -> list[dict]:
    values = naopc.mean(axis=1)
    out = []
    for (layer, metric, direction), part in values.groupby(level=["layer", "metric", "direction"]):
        m, lo, hi = mean_ci(
            part.to_numpy(), n_boot=n_boot, seed=seed, groups=part.index.get_level_values("document").to_numpy()
        )
        out.append(
            dict(
                layer=int(layer),
                direction=direction,
                metric=metric,
                **{name: float(m)},
                ci_low=float(lo),
                ci_high=float(hi),
                n_documents=int(len(part)),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Protocol 3's masking addendum (docs/faithfulness/v3/masking/PROTOCOL.md): nothing is excluded


def _aopc(conditions: pd.DataFrame, outcome: str, fractions: list[float]) -> pd.Series:
    """AOPC per (document, layer, metric, direction): the mean over the k grid of ``outcome``(k),
    in its own units (nats for the KL), with no denominator."""
    grid = conditions.pivot_table(
        index=["document", "layer", "metric", "direction"], columns="k", values=outcome, aggfunc="first"
    )
    missing = [k for k in fractions if k not in grid.columns]
    if missing or grid[fractions].isna().any().any():
        raise ValueError(f"some (document, layer, metric, direction) lack fractions of the grid {fractions}")
    groups = grid.groupby(level=["document", "layer"]).size()
    if (groups != groups.max()).any():
        raise ValueError(
            "some (document, layer) lack conditions of a metric or direction that others have: the comparison must be paired"
        )
    return grid[fractions].mean(axis=1)


def _metric_rows(per_doc: pd.DataFrame, boot: np.ndarray, name: str) -> list[dict]:
    lo, hi = percentile_ci(boot, 0.95, omit_nan=True)
    return [
        nan_to_none(
            dict(
                direction=d,
                metric=m,
                **{name: float(per_doc.iloc[:, c].mean())},
                ci_low=float(lo[c]),
                ci_high=float(hi[c]),
                n_documents=int(per_doc.iloc[:, c].notna().sum()),
            )
        )
        for c, (d, m) in enumerate(per_doc.columns)
    ]


def _protocol_2_rules(rows: pd.DataFrame, min_kl: float) -> dict:
    """What protocol 2's range and ceiling rules would have excluded from these rows, reported
    and not applied: the (document, layer)s each rule flags, per layer, and the layers a rule
    would have dropped whole (every one of their (document, layer)s flagged)."""
    table, range_check, ceiling = _exclusions(rows, min_kl)
    per_layer = table.groupby(level="layer").agg(
        n_documents=("excluded", "size"),
        range_flagged=("range_excluded", "sum"),
        ceiling_flagged=("ceiling_excluded", "sum"),
        flagged=("excluded", "sum"),
    )
    whole = per_layer.index[per_layer.flagged == per_layer.n_documents]
    return dict(
        note="protocol 2's rules, reported and not applied: no condition, (document, layer) or layer is excluded",
        range_rule=dict(min_kl_all_removed=range_check["min_kl_all_removed"], flagged=range_check["excluded"]),
        ceiling_rule=dict(
            rule=ceiling["rule"],
            n_conditions=ceiling["n_conditions"],
            n_off_distribution=ceiling["n_off_distribution"],
            share=ceiling["share"],
            flagged=ceiling["excluded"],
        ),
        per_layer=[
            dict(layer=int(layer), **{k: int(v) for k, v in row.items()}) for layer, row in per_layer.iterrows()
        ],
        layers_a_rule_would_drop=[int(layer) for layer in whole],
    )


def _off_distribution(rows: pd.DataFrame) -> list[dict]:
    """Per (metric, direction): the conditions whose masked mean NLL exceeds the unigram
    cross-entropy of the same next tokens (reported, never excluded)."""
    checked = rows[rows.unigram_ce.notna()]
    off = (checked.nll > checked.unigram_ce).groupby([checked.metric, checked.direction]).agg(["sum", "size"])
    return [
        dict(metric=m, direction=d, n_off_distribution=int(r["sum"]), n_conditions=int(r["size"]))
        for (m, d), r in off.iterrows()
    ]


def masking_summary_no_exclusion(
    rows: pd.DataFrame,
    protocol,
    *,
    n_boot: int | None = None,
    seed: int | None = None,
    drop=(),
    family_only: bool = False,
) -> dict:
    """The masking endpoint of protocol 3's addendum (docs/faithfulness/v3/masking/PROTOCOL.md)
    from :func:`~geolens.faithfulness.layer_masking.layer_masking_document`'s rows: no
    condition, (document, layer) or layer is excluded (``whole_layers_excluded`` = 0).

    - **Primary**: the AOPC of the KL in nats (the mean over the k grid of KL(k), no
      denominator, so no range rule is needed) of each (document, layer, metric, direction); per
      document the mean over its layers; per metric and direction the mean over documents with a
      95% document-bootstrap interval; the pairs ``protocol["pairs"]`` in both directions
      (Δ > 0: b more faithful, as in :func:`masking_summary`) form one Holm family; a pair whose
      masks are identical in every condition of a direction is "not testable".
    - **Secondary** (95% intervals, no verdicts): the nAOPC with a pooled denominator, AOPC
      divided by the mean all-removed KL of the layer's documents (a constant of the layer, so
      no document is dropped); the AOPC of the drop −Δp of the clean top-1; per-layer AOPC.
    - **Reported**: the conditions off the unigram ceiling per metric and direction, and what
      protocol 2's range and ceiling rules would have excluded (:func:`_protocol_2_rules`), with
      ``layers_a_rule_would_drop``.

    ``drop``: tests ``(a, b, direction)`` left out of the family as duplicates of another test
    (protocol 4 §3: the opposite-sign control's sufficiency test of pair 7 is its comprehensiveness
    test again); they are listed in ``pairs_not_formed``. ``family_only``: only ``{"pairs": ...}``.
    """
    _check_rows(rows)
    second, stats = protocol["secondary"], protocol["statistics"]
    n_boot = int(stats["n_boot"]) if n_boot is None else int(n_boot)
    seed = int(stats["seed"]) if seed is None else int(seed)
    alpha = float(stats.get("alpha", 0.05))
    fractions = [float(k) for k in second["fractions"]]
    directions = [d for d in DIRECTIONS if d in set(rows.direction)]
    rules = _protocol_2_rules(rows, float(second.get("range_check_min_kl_all_removed", 1e-3)))
    all_removed = rows[rows.metric == ALL_REMOVED].set_index(["document", "layer"])
    conditions = rows[rows.metric != ALL_REMOVED]
    aopc = _aopc(conditions, "kl", fractions)
    per_doc = _per_document(aopc)
    documents = per_doc.index.to_numpy()
    indices = cluster_bootstrap_indices(documents, n_boot, seed)
    boot = resample_means(per_doc.to_numpy(), indices)
    present = set(conditions.metric)
    formed, not_formed = _pair_list(protocol, present)
    hashes = conditions.set_index(["document", "layer", "metric", "direction", "k"]).mask_hash
    pairs = _pair_family(per_doc, boot, hashes, formed, not_formed, directions, alpha, "aopc_kl", drop)
    if family_only:
        return dict(pairs=pairs)

    layer_kl_all = all_removed.kl.groupby(level="layer").mean()
    pooled = aopc / layer_kl_all.reindex(aopc.index.get_level_values("layer")).to_numpy()
    pooled_doc = _per_document(pooled).reindex(documents)
    pooled_boot = resample_means(pooled_doc.to_numpy(), indices, omit_nan=True)
    drop = _aopc(conditions.assign(drop=-conditions.delta_p), "drop", fractions)
    drop_doc = _per_document(drop).reindex(documents)
    drop_boot = resample_means(drop_doc.to_numpy(), indices)
    return dict(
        endpoint="aopc_kl",
        outcome="kl",
        units="nats",
        masking_scope="layer",
        ranking_scope="query",
        fractions=fractions,
        directions=directions,
        layers_per_document=int(second.get("n_layers_per_document", 3)),
        exclusions="none",
        whole_layers_excluded=0,
        document_layers_excluded=0,
        conditions_excluded=0,
        n_documents=int(len(per_doc)),
        n_document_layers=int(len(all_removed)),
        multiple_comparison="holm",
        alpha=alpha,
        n_boot=n_boot,
        seed=seed,
        metrics=_metric_rows(per_doc, boot, "aopc_kl"),
        pairs=pairs,
        pairs_not_formed=not_formed,
        kl_all_removed_by_layer=[dict(layer=int(l), kl=float(v)) for l, v in layer_kl_all.items()],
        off_distribution=_off_distribution(rows),
        protocol_2_rules=rules,
        secondary=dict(
            note="95% intervals on the same document resamples, no verdicts",
            pooled_naopc=dict(
                denominator="mean all-removed KL of the layer's documents",
                metrics=_metric_rows(pooled_doc, pooled_boot, "naopc"),
                pairs=_pair_intervals(pooled_doc, pooled_boot, formed, directions),
            ),
            aopc_drop=dict(
                outcome="-delta_p of the clean top-1",
                metrics=_metric_rows(drop_doc, drop_boot, "aopc_drop"),
                pairs=_pair_intervals(drop_doc, drop_boot, formed, directions),
            ),
            per_layer=_per_layer(aopc.to_frame("aopc"), n_boot, seed, "aopc_kl"),
        ),
    )


__all__ = ["MIN_DELTA_P_ALL_REMOVED", "masking_summary", "masking_summary_no_exclusion"]
