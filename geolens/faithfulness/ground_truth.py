"""The per-term endpoint of protocol 2 (docs/faithfulness/PROTOCOL.md §2): metrics against measured effects.

For a sample of positions (layer l, query i), every attention term α_ij^h ṽ_j^h is removed alone
and its exact effect on the next-token prediction at i is measured (:mod:`geolens.per_term`):
KL(p_clean ‖ p_removed) (primary outcome) and Δp of the clean top-1 token (secondary, ranked as
−Δp, the drop). Each attribution metric's scores of the same terms are then compared with these
effects, per position, by the Spearman correlation and the top-5 overlap. Because the effects are
measured, not implied by a metric's definition, the comparison is not circular: a metric ranks
well only if it predicts what removing a term really does.

Scopes: **term** (every (h, j) with α_ij^h ≠ 0) and **source** (each j removed from every head).
Metrics (term scope; the source scope sums them over heads, |c| as Σ_h |c_ij^h|):

- ``raw_attention`` α_ij^h; ``value_weighted`` α‖ṽ_j^h‖ (Kobayashi et al. 2020);
- ``output_normalized_intra`` α‖ṽ_j^h‖/‖o_i^h‖ (the head's output) and
  ``output_normalized_inter`` α‖ṽ_j^h‖/‖o_i‖ (the layer's);
- ``contribution`` c_ij^h = ⟨o_i, α ṽ_j^h⟩/‖o_i‖² (inter mode, signed), ``contribution_abs`` |c|;
- ``grad_x_act``: −⟨∂ log p_{t*}/∂a_i, α ṽ_j^h⟩, the first-order estimate of the removal's change
  of log p_{t*} (attribution patching, Syed et al. 2023), ranked by |·| against KL and as the
  estimated drop −(grad × act) against −Δp;
- ``value_zeroing`` (source scope only, Mohebbi et al. 2023, at the position's query);
- ``random``: uniform scores, the floor.

Per position, a metric's **Spearman correlation** with the effects (average ranks for ties; 0 when
the metric scores every term alike: it ranks nothing) and its **top-5 overlap**
|top-5 by metric ∩ top-5 by effect| / 5 (ties broken by (head, source) order). A position with
fewer than 5 terms, or whose effects are all equal, is excluded and counted.

:func:`ground_truth_document` measures one document's positions; :func:`ground_truth_summary`
turns the rows of all documents into per-metric means with document-cluster bootstrap CIs and the
pre-registered pairs, one Holm family (:func:`geolens.stats.holm_family`), and
:func:`single_term_effects` says how large the measured effects are.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from geolens.adapter import adapter_for, get_attention_layer, names_filter
from geolens.metrics import LayerInputs
from geolens.per_term import PositionEffects, position_effects
from geolens.stats import cluster_bootstrap_indices, holm_family, nan_to_none, percentile_ci, resample_means

OUTCOMES = ("kl", "delta_p")
TERM_METRICS = (
    "raw_attention",
    "value_weighted",
    "output_normalized_intra",
    "output_normalized_inter",
    "contribution",
    "contribution_abs",
    "grad_x_act",
    "random",
)
SOURCE_METRICS = TERM_METRICS[:-1] + ("value_zeroing", "random")
LABELS = {"grad_x_act": "gradient × activation"}
"""Labels of the metrics defined here; the others are registered metrics or their mode variants,
labelled by :func:`geolens.metrics.metric_label`."""
TOP_K = 5
MIN_TERMS = 5


def draw_positions(
    document_index: int, n_layers: int, n_positions: int, queries: tuple[int, int], *, seed: int = 2026
) -> list[tuple[int, int]]:
    """The (layer, query) positions of one document (PROTOCOL.md §2): for each position in turn,
    the layer uniform in 0 … L−1, then the query uniform in ``queries`` (inclusive), from
    ``numpy.random.default_rng([seed, document_index])`` (protocol 2: 2026; protocol 3: 3).

    >>> draw_positions(0, 30, 3, (8, 126)) == draw_positions(0, 30, 3, (8, 126))
    True
    """
    rng = np.random.default_rng([int(seed), int(document_index)])
    lo, hi = int(queries[0]), int(queries[1])
    out = []
    for _ in range(int(n_positions)):
        layer = int(rng.integers(0, n_layers))
        out.append((layer, int(rng.integers(lo, hi + 1))))
    return out


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1 … n, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # one value per run of ties
    return ranks


def spearman(scores: np.ndarray, effects: np.ndarray) -> float:
    """Spearman's ρ (Pearson correlation of average ranks); 0.0 when ``scores`` are all equal,
    NaN when ``effects`` are (the position is then excluded).

    >>> spearman(np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.5, 0.2]))
    0.5
    """
    if np.ptp(effects) == 0:
        return float("nan")
    if np.ptp(scores) == 0:
        return 0.0
    a, b = _average_ranks(np.asarray(scores, dtype=np.float64)), _average_ranks(np.asarray(effects, dtype=np.float64))
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def top_overlap(scores: np.ndarray, effects: np.ndarray, k: int = TOP_K) -> float:
    """|top-k by ``scores`` ∩ top-k by ``effects``| / k, ties broken by index order.

    >>> top_overlap(np.array([5.0, 4, 3, 2, 1, 0]), np.array([0.0, 4, 3, 2, 1, 5]), k=2)
    0.5
    """
    a = np.argsort(-scores, kind="stable")[:k]
    b = np.argsort(-effects, kind="stable")[:k]
    return len(set(a.tolist()) & set(b.tolist())) / k


def _ranking_key(scores: np.ndarray) -> str:
    """A digest of the order a metric gives the terms (equal digests: identical rankings)."""
    return hashlib.blake2b(np.argsort(-scores, kind="stable").astype(np.int32).tobytes(), digest_size=8).hexdigest()


def term_scores(
    inter: LayerInputs, intra: LayerInputs, effects: PositionEffects, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Each term-scope metric's scores ``[head, source]`` (float64) of one position."""
    i = effects.term.query
    n = i + 1

    def row(x: torch.Tensor) -> np.ndarray:
        return x[0, :, i, :n].double().numpy() if x.shape[2] > 1 else x[0, :, 0, :n].double().numpy()

    alpha = row(inter.alpha)
    weighted = alpha * row(inter.value_norm)
    c = row(inter.contribution)
    return {
        "raw_attention": alpha,
        "value_weighted": weighted,
        "output_normalized_intra": alpha * row(intra.relative),
        "output_normalized_inter": alpha * row(inter.relative),
        "contribution": c,
        "contribution_abs": np.abs(c),
        "grad_x_act": effects.grad_x_act.numpy(),
        "random": rng.random(alpha.shape),
    }


def _oriented(metric: str, scores: np.ndarray, outcome: str) -> np.ndarray:
    """Gradient × activation is ranked by |·| against KL and as the estimated drop against −Δp."""
    if metric != "grad_x_act":
        return scores
    return np.abs(scores) if outcome == "kl" else -scores


def position_rows(
    effects: PositionEffects, scores: dict[str, np.ndarray], value_zeroing: np.ndarray, ids: dict
) -> list[dict]:
    """One row per (scope, outcome, metric) of one position: Spearman, top-5 overlap, the count
    of terms, whether the position is excluded and a digest of the metric's ranking."""
    rows = []
    term_ran = effects.term.ran.numpy()
    source_ran = effects.source.ran.numpy()
    term = {m: np.where(term_ran, s, 0.0) for m, s in scores.items()}
    source = {m: s.sum(0) for m, s in term.items()}
    source["value_zeroing"] = np.asarray(value_zeroing, dtype=np.float64)
    for scope, table, ran, measured in (
        ("term", term, term_ran, effects.term),
        ("source", source, source_ran, effects.source),
    ):
        names = TERM_METRICS if scope == "term" else SOURCE_METRICS
        for outcome in OUTCOMES:
            effect = measured.kl.numpy() if outcome == "kl" else -measured.delta_p.numpy()
            e = effect[ran]
            excluded = e.size < MIN_TERMS or np.ptp(e) == 0
            for metric in names:
                s = _oriented(metric, table[metric], outcome)[ran]
                rows.append(
                    dict(
                        **ids,
                        scope=scope,
                        outcome=outcome,
                        metric=metric,
                        n_terms=int(e.size),
                        excluded=bool(excluded),
                        spearman=np.nan if excluded else spearman(s, e),
                        top5=np.nan if excluded else top_overlap(s, e),
                        ranking=_ranking_key(s),
                    )
                )
    return rows


def ground_truth_document(
    model,
    tokens: torch.Tensor,
    document_index: int,
    *,
    n_positions: int = 20,
    queries: tuple[int, int] = (8, 126),
    batch_size: int = 128,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-term endpoint on one window ``[1, pos]``: ``(rows, positions)``.

    ``rows``: :func:`position_rows` of each drawn position (:func:`draw_positions`), with the
    document, the position's index, layer and query. ``positions``: one row per position with
    the clean top-1 probability and the largest and summed single-term and single-source KL.
    One clean ``run_with_cache`` and one KV cache of the window serve every position; a
    (layer, query) drawn twice is measured once.
    """
    from geolens.faithfulness.value_zeroing import value_zeroing

    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(f"tokens must be one window [1, pos], got shape {tuple(tokens.shape)}")
    n_pos = tokens.shape[1]
    if not 0 <= queries[0] <= queries[1] < n_pos:
        raise ValueError(f"queries {queries} do not fit a window of {n_pos} tokens")
    n_layers = model.cfg.n_layers
    drawn = draw_positions(document_index, n_layers, n_positions, queries)
    layers = sorted({l for l, _ in drawn})
    adapter = adapter_for(model)
    wanted = names_filter(model, layers)
    resid = {adapter.resid_pre_hook(l) for l in layers}
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda name: wanted(name) or name in resid)
        kv = adapter.prefix_kv_cache(tokens)
        inputs = {}
        for l in layers:
            view = get_attention_layer(model, cache, l)
            inputs[l] = (LayerInputs.from_layer(view, "inter"), LayerInputs.from_layer(view, "intra"))
    vz = value_zeroing(model, tokens, layers, queries={l: sorted({q for ll, q in drawn if ll == l}) for l in layers})
    measured: dict[tuple[int, int], PositionEffects] = {}
    rows, positions = [], []
    for p, (l, q) in enumerate(drawn):
        if (l, q) not in measured:
            measured[(l, q)] = position_effects(
                model, tokens, l, q, clean_run=(logits, cache), kv_cache=kv, batch_size=batch_size
            )
        e = measured[(l, q)]
        rng = np.random.default_rng([2026, int(document_index), p, 1])
        scores = term_scores(*inputs[l], e, rng)
        ids = dict(document=int(document_index), position=p, layer=l, query=q)
        rows += position_rows(e, scores, vz[layers.index(l), 0, q, : q + 1].double().numpy(), ids)
        positions.append(
            dict(
                **ids,
                n_terms=int(e.term.ran.sum()),
                clean_top_prob=e.term.clean_prob,
                kl_term_max=float(e.term.kl.max()),
                kl_term_sum=float(e.term.kl.sum()),
                kl_source_max=float(e.source.kl.max()),
                delta_p_term_min=float(e.term.delta_p.min()),
            )
        )
    return pd.DataFrame(rows), pd.DataFrame(positions)


# ---------------------------------------------------------------------------------------------
# Summary: per-metric means with document-cluster CIs, and the pre-registered family


def _pivot(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Positions × metrics of one (scope, outcome), excluded positions dropped."""
    kept = rows[~rows.excluded]
    return kept.pivot(index=["document", "position"], columns="metric", values=column)


def ground_truth_summary(
    rows: pd.DataFrame, pairs: Sequence[Sequence[str]], *, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05
) -> dict:
    """Per (scope, outcome, metric): mean Spearman and top-5 overlap over positions, with 95%
    document-cluster bootstrap CIs (documents drawn with replacement, each bringing all its
    positions; the same draws for every metric of a (scope, outcome)); and the pre-registered
    ``pairs`` (a → b: "b agrees better with the measured effects"), at both scopes, KL outcome,
    Δ = mean Spearman(b) − mean Spearman(a) on the same resamples, as one Holm family
    (:func:`geolens.stats.holm_family`). A pair is formed only at a scope where both metrics
    exist (Value Zeroing: source scope); it is "not testable" when the two metrics rank the terms
    of every position identically (equal ranking digests). The Δp outcome's pairs are given
    with 95% CIs, exploratory, outside the family.
    """
    if rows.empty:
        raise ValueError("no per-term rows to summarise")
    metrics_out, family, exploratory = [], [], []
    samples_by = {}
    for (scope, outcome), part in rows.groupby(["scope", "outcome"], sort=False):
        order = [m for m in (TERM_METRICS if scope == "term" else SOURCE_METRICS) if m in set(part.metric)]
        order += sorted(set(part.metric) - set(order))
        table = _pivot(part, "spearman")[order]
        top = _pivot(part, "top5")[order]
        documents = table.index.get_level_values("document").to_numpy()
        indices = cluster_bootstrap_indices(documents, n_boot, seed)
        boot = resample_means(table.to_numpy(), indices)
        boot_top = resample_means(top[table.columns].to_numpy(), indices)
        lo, hi = percentile_ci(boot, 0.95)
        tlo, thi = percentile_ci(boot_top, 0.95)
        n_excluded = int(part[part.metric == part.metric.iloc[0]].excluded.sum())
        for k, metric in enumerate(table.columns):
            metrics_out.append(
                dict(
                    scope=scope,
                    outcome=outcome,
                    metric=metric,
                    spearman=float(table[metric].mean()),
                    ci_low=float(lo[k]),
                    ci_high=float(hi[k]),
                    top5=float(top[metric].mean()),
                    top5_ci_low=float(tlo[k]),
                    top5_ci_high=float(thi[k]),
                    n_positions=int(len(table)),
                    n_documents=int(len(np.unique(documents))),
                    n_excluded_positions=n_excluded,
                )
            )
        samples_by[(scope, outcome)] = (table, boot, part)
    tests = []
    for outcome in OUTCOMES:
        for scope in ("term", "source"):
            if (scope, outcome) not in samples_by:
                continue
            table, boot, part = samples_by[(scope, outcome)]
            columns = list(table.columns)
            for a, b in pairs:
                if a not in columns or b not in columns:
                    continue
                ka, kb = columns.index(a), columns.index(b)
                rank_a = part[part.metric == a].set_index(["document", "position"]).ranking
                rank_b = part[part.metric == b].set_index(["document", "position"]).ranking
                same = bool((rank_a == rank_b.reindex(rank_a.index)).all())
                entry = dict(
                    endpoint="per_term",
                    scope=scope,
                    outcome=outcome,
                    a=a,
                    b=b,
                    n_positions=int(len(table)),
                    n_documents=int(table.index.get_level_values("document").nunique()),
                )
                delta = boot[:, kb] - boot[:, ka]
                estimate = float(table[b].mean() - table[a].mean())
                if outcome == "kl":
                    tests.append((entry, estimate, delta, not same))
                else:
                    lo, hi = percentile_ci(delta, 0.95)
                    exploratory.append(
                        dict(
                            entry,
                            estimate=estimate,
                            ci_low=float(lo),
                            ci_high=float(hi),
                            verdict="not testable" if same else None,
                        )
                    )
    decided = holm_family([t[1] for t in tests], [t[2] for t in tests], testable=[t[3] for t in tests], alpha=alpha)
    for (entry, *_), result in zip(tests, decided):
        family.append(dict(entry, **nan_to_none(result._asdict())))
    for e in exploratory:
        if e["verdict"] is None:
            e["verdict"] = "holds" if e["ci_low"] > 0 else "reversed" if e["ci_high"] < 0 else "tie"
            e["note"] = "exploratory: 95% CI, outside the Holm family"
    kl = [m for m in metrics_out if m["outcome"] == "kl"]
    return dict(
        outcome="kl",
        secondary_outcome="delta_p",
        n_positions=max(m["n_positions"] for m in kl) if kl else 0,
        n_documents=max(m["n_documents"] for m in kl) if kl else 0,
        metrics=metrics_out,
        pairs=family,
        exploratory_pairs=exploratory,
        multiple_comparison="holm",
        n_boot=int(n_boot),
        seed=int(seed),
    )


def single_term_effects(positions: pd.DataFrame) -> dict:
    """How large the single-term effects are over the ``positions`` rows of
    :func:`ground_truth_document`: their count and the medians of the largest term's KL, of all
    terms' KLs summed and of the clean top-1 probability."""
    return dict(
        n_positions=int(len(positions)),
        median_kl_of_largest_term=float(positions.kl_term_max.median()),
        median_kl_of_all_terms_summed=float(positions.kl_term_sum.median()),
        median_clean_top_prob=float(positions.clean_top_prob.median()),
    )
