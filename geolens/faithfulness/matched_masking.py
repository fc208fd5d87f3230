"""Masking with a size-matched random control (protocol 4, docs/faithfulness/v4/PROTOCOL.md §3).

A metric's comprehensiveness mask removes, for each query i, the terms α_ij^h ṽ_j^h it ranks
highest. How much the next-token prediction moves depends first on *how much* is removed: the
norm of the removed sum ‖Σ_{(h,j) removed} α_ij^h ṽ_j^h‖. A control of the same size is a random
set of the query's terms whose removed sum has the same norm, within a tolerance:

- **Draw** (:func:`matched_random_mask`): for query i, a uniformly random order of its terms
  (every (h, j) with α_ij^h ≠ 0); the running sums S_t of the first t terms of that order; at the
  first t where ‖S_t‖ reaches the target norm τ_i, the prefix S_t or S_{t−1}, whichever norm is
  closer to τ_i. It is kept when that norm lies within ``tolerance`` (5 %) of τ_i; otherwise
  another order is drawn, up to ``max_orders`` (10, protocol 4's). A query whose target no order
  matches keeps the closest prefix found and is counted as unmatched. (The search compares float32
  running sums; whether the kept prefix matched is decided from its float64 norm.)
- **Terms' vectors** (:func:`term_vectors`): ṽ_j^h = v_j^h W_O^h in the residual stream (d_model),
  computed in float64 from the layer's cached tensors, so that the norms of the sums are exact.
- **Seeds**: ``SeedSequence([2026, document, layer, 4, metric index, k index, draw])``
  (:func:`matched_seed`; the per-term and masking endpoints use the trailing entries 1 and 2).

:func:`matched_masking_document` masks each metric's top-k terms' size-matched controls in one
document's layer (``d mod L``) and measures them like every masking condition
(:func:`~geolens.faithfulness.masked_outcomes.masked_outcomes`). The metrics' own masks are the
masking addendum's (same windows, code, seeds and precision): their hashes must equal the stored
rows', and two stored conditions per document (the all-removed one and c's top 5 %) are measured
again and must agree, so the stored KL of every metric mask is reused rather than recomputed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from geolens.adapter import adapter_for, get_attention_layer, names_filter
from geolens.faithfulness.layer_masking import (
    ALL_REMOVED,
    mask_hash,
    masking_layers,
    masking_random_seed,
    masking_scores,
    query_masks,
    scored_positions,
)
from geolens.faithfulness.masked_outcomes import check_tokens, masked_outcomes

MATCHED = "matched_control"  # metric name of the control rows; ``target`` names the metric matched
CHECKED = "recomputed"  # rows measuring a stored condition again
COLUMNS = (
    "document",
    "layer",
    "metric",
    "target",
    "k",
    "draw",
    "n_terms",
    "n_removed",
    "n_removed_target",
    "norm_ratio_median",
    "n_unmatched",
    "kl",
    "delta_p",
    "stored_kl",
    "mask_hash",
)


def matched_seed(document: int, layer: int, metric_index: int, k_index: int, draw: int) -> int:
    """The seed of one control draw (module docstring).

    >>> matched_seed(0, 0, 0, 0, 0) == matched_seed(0, 0, 0, 0, 0) != matched_seed(0, 0, 0, 0, 1)
    True
    """
    entropy = [2026, int(document), int(layer), 4, int(metric_index), int(k_index), int(draw)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def term_vectors(view) -> Float[Tensor, "head query key d_model"]:
    """α_ij^h ṽ_j^h for every (head, query, key) of a batch-of-one layer view, float64.

    >>> import geolens, torch
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model)[:1], names_filter=geolens.names_filter(model))
    >>> view = geolens.get_attention_layer(model, cache, 0)
    >>> u = term_vectors(view)
    >>> from geolens.geometry import layer_output
    >>> o = u.sum((0, 2)) + view.b_O.double()  # the layer's attention output
    >>> bool(torch.allclose(o, layer_output(view)[0].double(), atol=1e-5))
    True
    """
    if view.pattern.shape[0] != 1:
        raise ValueError(f"term_vectors takes the layer of one sequence, got a batch of {view.pattern.shape[0]}")
    vt = torch.einsum("khd,hdm->hkm", view.v[0].double(), view.W_O.double())  # ṽ_j^h [head, key, d_model]
    return view.pattern[0].double()[..., None] * vt[:, None]


class QueryTerms:
    """Each query's terms, prepared once for many draws: the flat (head, key) index of every term
    (α_ij^h ≠ 0) and its vector α_ij^h ṽ_j^h (float64, and float32 for the running sums)."""

    def __init__(self, vectors: Float[Tensor, "head query key d_model"], terms: Bool[Tensor, "head query key"]):
        if vectors.shape[:3] != terms.shape:
            raise ValueError(f"vectors {tuple(vectors.shape)} and terms {tuple(terms.shape)} disagree")
        self.shape = tuple(terms.shape)
        H, Q, K = self.shape
        v = vectors.detach().to("cpu", torch.float64).permute(1, 0, 2, 3).reshape(Q, H * K, -1).numpy()
        flat = terms.detach().cpu().permute(1, 0, 2).reshape(Q, H * K).numpy()
        self.index = [np.flatnonzero(flat[i]) for i in range(Q)]
        self.u64 = [np.ascontiguousarray(v[i, idx]) for i, idx in enumerate(self.index)]
        self.u32 = [u.astype(np.float32) for u in self.u64]


def matched_random_mask(
    vectors: "QueryTerms | Tensor",
    terms: Bool[Tensor, "head query key"] | None,
    target: Bool[Tensor, "head query key"],
    rng: np.random.Generator,
    *,
    tolerance: float = 0.05,
    max_orders: int = 10,
) -> tuple[Bool[Tensor, "head query key"], np.ndarray, np.ndarray]:
    """A random mask whose removed sum has, query by query, the norm of ``target``'s (module
    docstring). ``vectors``: :func:`term_vectors` ``[head, query, key, d_model]`` with ``terms``,
    or a :class:`QueryTerms` made of them once (``terms`` then None). Returns ``(mask, ratio,
    matched)``: the mask, each query's achieved norm over its target norm, and whether it lies
    within ``tolerance`` (queries removing nothing: ratio 1, matched).

    >>> import torch, numpy as np
    >>> vectors = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
    >>> vectors[0, 0, :, 0] = torch.tensor([1.0, 2.0, 4.0, 8.0])
    >>> terms = torch.ones(1, 1, 4, dtype=torch.bool)
    >>> target = torch.tensor([[[False, False, True, False]]])  # removes a norm of 4
    >>> mask, ratio, ok = matched_random_mask(vectors, terms, target, np.random.default_rng(0))
    >>> abs(float(vectors[mask].sum(0).norm()) / 4.0 - 1) <= 0.05, bool(ok[0]), float(ratio[0]) == float(vectors[mask].sum(0).norm()) / 4.0
    (True, True, True)
    """
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
    if int(max_orders) < 1:
        raise ValueError(f"max_orders must be at least 1, got {max_orders}")
    prepared = vectors if isinstance(vectors, QueryTerms) else QueryTerms(vectors, terms)
    H, Q, K = prepared.shape
    if tuple(target.shape) != (H, Q, K):
        raise ValueError(f"target {tuple(target.shape)} must be [head, query, key] = {(H, Q, K)}")
    chosen_all = target.detach().cpu().permute(1, 0, 2).reshape(Q, H * K).numpy()
    out = np.zeros((Q, H * K), dtype=bool)
    ratio = np.ones(Q)
    matched = np.ones(Q, dtype=bool)
    for i in range(Q):
        index, u64, u32 = prepared.index[i], prepared.u64[i], prepared.u32[i]
        chosen = chosen_all[i, index]
        if not chosen.any():
            continue
        tau = float(np.linalg.norm(u64[chosen].sum(0)))
        best, best_gap, tried = None, float("inf"), 0
        while tried < int(max_orders) and best_gap > tolerance * tau:
            n_orders = min(int(max_orders) - tried, 1 if tried == 0 else 2 * tried)  # 1, 2, 4, … orders at once
            orders = np.stack([rng.permutation(len(index)) for _ in range(n_orders)])
            tried += n_orders
            norms = np.linalg.norm(np.cumsum(u32[orders], axis=1), axis=-1).astype(np.float64)
            for order, row in zip(orders, norms):
                gaps = np.abs(row - tau)
                crossed = np.flatnonzero(row >= tau)
                if crossed.size:  # the first crossing of τ: the prefix just before or at it, the closer
                    t = int(crossed[0])
                    t = t - 1 if t > 0 and gaps[t - 1] < gaps[t] else t
                else:
                    t = int(np.argmin(gaps))
                if gaps[t] < best_gap:
                    best, best_gap = order[: t + 1], float(gaps[t])
                if best_gap <= tolerance * tau:
                    break
        if best is None:  # no finite running norm: the query's terms cannot be matched
            best = np.arange(1)
        out[i, index[best]] = True
        ratio[i] = float(np.linalg.norm(u64[best].sum(0))) / tau if tau > 0 else 1.0
        matched[i] = abs(ratio[i] - 1.0) <= tolerance
    mask = torch.from_numpy(out).reshape(Q, H, K).permute(1, 0, 2).contiguous()
    return mask, ratio, matched


def matched_masking_document(
    model,
    tokens,
    document_index: int,
    *,
    protocol,
    stored: pd.DataFrame,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Protocol 4's size-matched controls on one window (module docstring), one row per (metric
    matched, k, draw) plus the :data:`CHECKED` rows, columns :data:`COLUMNS`.

    ``protocol``: protocol 4's twin as a dict, or its ``matched_masking`` section (``metrics``,
    ``fractions``, ``draws``, ``tolerance``, ``max_orders``, ``check``, ``check_rtol`` and the
    addendum's ``scored_positions``); ``stored``:
    the addendum's rows of this document (``masking_rows.csv.gz``). ValueError when a metric's mask
    differs from the stored one; RuntimeError when a recomputed condition's KL differs from the
    stored KL by more than ``check_rtol``.
    """
    section = protocol["matched_masking"] if "matched_masking" in protocol else protocol
    tokens = check_tokens(model, tokens)
    positions = scored_positions({"secondary": {"scored_positions": section["scored_positions"]}})
    fractions = [float(k) for k in section["fractions"]]
    metrics = list(section["metrics"])
    draws, tolerance, max_orders = int(section["draws"]), float(section["tolerance"]), int(section["max_orders"])
    (layer,) = masking_layers(document_index, model.cfg.n_layers, 1)
    adapter = adapter_for(model)
    wanted = names_filter(model, [layer])
    resid = adapter.resid_pre_hook(layer)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda name: wanted(name) or name == resid)
    clean_logits = logits[0, positions]
    view = get_attention_layer(model, cache, layer)
    terms = view.pattern[0] != 0
    scores = masking_scores(view, metrics, random_seed=masking_random_seed(document_index, layer))
    prepared = QueryTerms(term_vectors(view), terms)
    here = stored[(stored.document == document_index) & (stored.layer == layer)]
    conditions, meta = [], []
    for mi, metric in enumerate(metrics):
        targets = query_masks(scores[metric], terms, fractions, largest=True)
        for ki, (k, target) in enumerate(zip(fractions, targets)):
            row = here[(here.metric == metric) & (here.direction == "comprehensiveness") & np.isclose(here.k, k)]
            if len(row) != 1 or row.mask_hash.iloc[0] != mask_hash(target):
                raise ValueError(
                    f"document {document_index}, layer {layer}: {metric}'s top {k:g} mask is not the stored one"
                )
            for draw in range(draws):
                rng = np.random.default_rng(matched_seed(document_index, layer, mi, ki, draw))
                mask, ratio, ok = matched_random_mask(
                    prepared, None, target, rng, tolerance=tolerance, max_orders=max_orders
                )
                conditions.append(mask)
                meta.append(
                    dict(
                        metric=MATCHED,
                        target=metric,
                        k=k,
                        draw=draw,
                        n_removed_target=int(target.sum()),
                        norm_ratio_median=float(np.median(ratio[target.any((0, 2)).numpy()])),
                        n_unmatched=int((~ok).sum()),
                        stored_kl=float("nan"),
                    )
                )
    check_metric, check_k = section["check"]
    for metric, k in ((ALL_REMOVED, 1.0), (check_metric, float(check_k))):
        row = here[(here.metric == metric) & np.isclose(here.k, k)]
        if metric != ALL_REMOVED:
            row = row[row.direction == "comprehensiveness"]
        mask = terms.clone() if metric == ALL_REMOVED else query_masks(scores[metric], terms, [k], largest=True)[0]
        conditions.append(mask)
        meta.append(
            dict(
                metric=CHECKED,
                target=metric,
                k=k,
                draw=-1,
                n_removed_target=int(mask.sum()),
                norm_ratio_median=1.0,
                n_unmatched=0,
                stored_kl=float(row.kl.iloc[0]),
            )
        )
    masks = torch.stack(conditions)
    measured = masked_outcomes(
        model, tokens, layer, masks, positions, clean_logits, resid_pre=cache[resid], batch_size=batch_size
    )
    del cache
    kl, dp = measured["kl"].mean(1), measured["delta_p"].mean(1)
    rtol = float(section["check_rtol"])
    rows = []
    for m, mask, kl_u, dp_u in zip(meta, conditions, kl.tolist(), dp.tolist()):
        if m["metric"] == CHECKED and abs(kl_u - m["stored_kl"]) > rtol * abs(m["stored_kl"]) + 1e-9:
            raise RuntimeError(
                f"document {document_index}, layer {layer}: {m['target']} at k={m['k']:g} gives KL {kl_u:.9g} "
                f"against the stored {m['stored_kl']:.9g}; the stored rows cannot be reused"
            )
        rows.append(
            dict(
                document=int(document_index),
                layer=int(layer),
                n_terms=int(terms.sum()),
                n_removed=int(mask.sum()),
                kl=kl_u,
                delta_p=dp_u,
                mask_hash=mask_hash(mask),
                **m,
            )
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def matched_conditions(metrics: Sequence[str], fractions: Sequence[float], draws: int) -> int:
    """The number of masked forwards per document: one per (metric, k, draw), plus two checks.

    >>> matched_conditions(["raw_attention", "contribution"], [0.01, 0.2], 3)
    14
    """
    return len(metrics) * len(fractions) * int(draws) + 2


__all__ = [
    "CHECKED",
    "COLUMNS",
    "MATCHED",
    "QueryTerms",
    "matched_conditions",
    "matched_masking_document",
    "matched_random_mask",
    "matched_seed",
    "term_vectors",
]
