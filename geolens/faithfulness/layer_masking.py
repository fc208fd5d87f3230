"""The per-layer masking endpoint of protocol 2 (docs/faithfulness/PROTOCOL.md §3, pairs §4).

One layer l at a time, a metric's ranking decides which attention terms α_ij^h ṽ_j^h of that layer
are removed, α_ij^h = 0 in ``hook_pattern`` without renormalising (docs/method.md §3), for every
query i at once, and the effect on the model's next-token predictions is measured.

- **Layers** (:func:`masking_layers`): document d masks three layers, d mod L, (d + ⌊L/3⌋) mod L
  and (d + 2⌊L/3⌋) mod L, one in each third of the stack.
- **Terms**: the (head h, source j) pairs of query i with α_ij^h ≠ 0 (a source outside a sliding
  window, α = 0, is no term), as in the per-term endpoint (PROTOCOL.md §2). The sink and the
  current token are terms like the others.
- **Ranking** (:func:`query_masks`): ``query`` ranking, all (h, j) terms of one query pooled on
  the metric's scale. Value Zeroing scores sources: its ranked units are the query's sources
  (j with some α_ij^h ≠ 0), each removed in every head.
- **Fractions**: k of the query's ranked units, rounded up: ⌈k · n_i⌉ (at least one).
  Comprehensiveness removes the top ⌈k n_i⌉, sufficiency the bottom ⌈k n_i⌉; ties are broken
  by increasing source index, then head (:func:`geolens.interventions.masking.removal_ranks`).
- **Metrics** (:data:`MASKING_METRICS`, scores from one clean ``run_with_cache``, registered
  definitions of :mod:`geolens.metrics`): ``raw_attention`` α, ``value_weighted`` α‖ṽ_j^h‖,
  ``output_normalized_intra`` α‖ṽ_j^h‖/‖o_i^h‖ (each head's own output norm),
  ``output_normalized_inter`` α‖ṽ_j^h‖/‖o_i‖ (the layer's: it ranks a query's terms exactly as
  value-weighted does; formed only because pair 3 names it, and its forwards are shared with
  value-weighted's identical masks), ``contribution`` c_ij^h (inter mode, signed),
  ``contribution_abs`` |c_ij^h|, ``contribution_negated`` −c_ij^h (protocol 3's opposite-sign
  control: its comprehensiveness removes the most negative terms first), ``value_zeroing`` (Mohebbi et al. 2023,
  :func:`geolens.faithfulness.value_zeroing`) and ``random``: uniform scores of
  :func:`geolens.interventions.masking.random_scores` seeded by :func:`masking_random_seed`.
- **Conditions** of a layer: every (metric, direction, k), plus **all removed**: every α of the
  layer zeroed, which leaves the attention output equal to b_O (0 for models without an output
  bias, SmolLM2 and Gemma 3): the whole attention output removed.
- **Forwards** (:func:`masked_outcomes`): each masked forward starts at layer l from the clean
  residual stream entering it (``ModelAdapter.forward_from_layer``: the blocks before l do not
  run), the conditions of one layer are the rows of a batch, identical masks run once, and only
  the scored positions are unembedded. Every batch has one unmasked row, which must reproduce
  the clean logits.
- **Outcomes** at the scored predictions (positions 8, 12, …, 124: the logits at position p
  predict token p + 1), with p the clean next-token distribution and p̃ the masked one, from the
  logits in float64, averaged over the scored positions:

      KL = Σ_t p_t (log p_t − log p̃_t),    Δp = p̃_{t*} − p_{t*} (t* the clean top-1),
      NLL = −log p̃(x_{p+1}) (the ceiling check),  unigram CE = −log u(x_{p+1}).

:func:`geolens.faithfulness.masking_summary.masking_summary` turns the rows of all documents into
normalised AOPC, the range and ceiling checks, per-metric means with document bootstrap CIs and the
pre-registered pairs as one Holm family (:func:`geolens.stats.holm_family`).
"""

from __future__ import annotations

import hashlib
import math
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from geolens.adapter import adapter_for, get_attention_layer, names_filter
from geolens.faithfulness.masked_outcomes import check_tokens, masked_outcomes
from geolens.interventions.masking import random_scores, removal_ranks
from geolens.metrics import LayerInputs, find_metric, mode_variant, sign_variant

MASKING_METRICS: tuple[str, ...] = (
    "raw_attention",
    "value_weighted",
    "output_normalized_intra",
    "output_normalized_inter",
    "contribution",
    "contribution_abs",
    "contribution_negated",
    "value_zeroing",
    "random",
)
ALL_REMOVED = "all_removed"  # metric and direction of the condition removing every term of the layer
DIRECTIONS = ("comprehensiveness", "sufficiency")
SECTION_2_ONLY = ("grad_x_act",)  # metrics of pairs that the masking endpoint does not form
COLUMNS = (
    "document",
    "layer",
    "metric",
    "direction",
    "k",
    "n_terms",
    "n_removed",
    "kl",
    "delta_p",
    "nll",
    "clean_nll",
    "unigram_ce",
    "mask_hash",
)


class Condition(NamedTuple):
    """One masked forward of a layer: the metric, direction and fraction, and its mask
    ``[head, query, key]`` (True = α_ij^h set to 0)."""

    metric: str
    direction: str
    k: float
    mask: Bool[Tensor, "head query key"]


# ---------------------------------------------------------------------------------------------
# The protocol's choices


def masking_layers(document_index: int, n_layers: int, per_document: int = 3) -> tuple[int, ...]:
    """The layers masked in document d: protocol 2 (PROTOCOL.md §3) masks three, d mod L,
    (d + ⌊L/3⌋) mod L and (d + 2⌊L/3⌋) mod L, one in each third of the stack; over L consecutive
    documents every layer is masked equally often. With L < 3 the three coincide.
    ``per_document`` = 1 (the masking addendum of protocol 3, ``secondary.n_layers_per_document``)
    keeps the first, d mod L.

    >>> masking_layers(0, 30), masking_layers(7, 30), masking_layers(17, 18), masking_layers(31, 30, 1)
    ((0, 10, 20), (7, 17, 27), (17, 5, 11), (1,))
    """
    d, L = _check_index(document_index), int(n_layers)
    if L < 1:
        raise ValueError(f"n_layers must be at least 1, got {n_layers}")
    if per_document not in (1, 2, 3):
        raise ValueError(f"layers per document must be 1, 2 or 3, got {per_document!r}")
    step = L // 3
    return (d % L, (d + step) % L, (d + 2 * step) % L)[: int(per_document)]


def masking_random_seed(document_index: int, layer: int) -> int:
    """The seed of the random metric's scores of one (document, layer):
    ``numpy.random.SeedSequence([2026, document_index, layer, 2]).generate_state(1)[0]`` (the
    per-term endpoint draws from ``[2026, document_index, position, 1]``; the last entry keeps the
    two streams apart).

    >>> masking_random_seed(3, 12) == masking_random_seed(3, 12) != masking_random_seed(3, 13)
    True
    """
    return int(np.random.SeedSequence([2026, _check_index(document_index), int(layer), 2]).generate_state(1)[0])


def scored_positions(protocol) -> list[int]:
    """The positions whose next-token predictions are scored: ``secondary.scored_positions`` =
    [first, last, step], both ends included (protocol 2: 8, 12, …, 124, 30 predictions).

    >>> p = scored_positions({"secondary": {"scored_positions": [8, 124, 4]}})
    >>> len(p), p[0], p[-1]
    (30, 8, 124)
    """
    first, last, step = (int(x) for x in protocol["secondary"]["scored_positions"])
    if first < 0 or last < first or step < 1:
        raise ValueError(
            f"secondary.scored_positions must be [first, last, step] with 0 ≤ first ≤ last, step ≥ 1; got {[first, last, step]}"
        )
    return list(range(first, last + 1, step))


def _check_index(document_index) -> int:
    if isinstance(document_index, bool) or not isinstance(document_index, (int, np.integer)) or document_index < 0:
        raise ValueError(f"document_index must be a non-negative integer, got {document_index!r}")
    return int(document_index)


def _n_take(n_units: Tensor, fraction: float) -> Tensor:
    """⌈fraction · n⌉ in integer arithmetic, the fraction read to 10⁻⁶ (so that 0.1 · 30 is 3,
    not the 4 that float rounding of 3.0000000000000004 would give)."""
    scaled = int(round(fraction * 1_000_000))
    return (n_units.long() * scaled + 999_999) // 1_000_000


# ---------------------------------------------------------------------------------------------
# Masks


def query_masks(
    scores: Float[Tensor, "head query key"],
    terms: Bool[Tensor, "head query key"],
    fractions: Sequence[float],
    *,
    largest: bool = True,
) -> list[Bool[Tensor, "head query key"]]:
    """Masks of ``query`` ranking for each fraction: for query i with n_i ranked units, the
    ⌈k · n_i⌉ with the largest (``largest=True``, comprehensiveness) or smallest (sufficiency)
    scores are removed.

    ``terms[h, i, j]`` marks the terms (α_ij^h ≠ 0). With a head axis of n_heads in ``scores`` the
    units are the query's terms (h, j), pooled over heads; with a head axis of 1 (one score per
    source, Value Zeroing) they are its sources j having a term in some head, and a removed
    source is removed in every head. Ties are broken by increasing source index, then head. Every
    mask comes back ``[head, query, key]`` with True on removed terms only (so that two
    conditions removing the same terms have equal masks).

    >>> import torch
    >>> terms = torch.tensor([[[True, False], [True, True]]])  # 1 head, queries 0 and 1
    >>> scores = torch.tensor([[[0.0, 0.0], [0.2, 0.7]]])
    >>> [m[0].tolist() for m in query_masks(scores, terms, [0.5, 1.0])]
    [[[True, False], [False, True]], [[True, False], [True, True]]]
    """
    if terms.dtype != torch.bool or terms.ndim != 3:
        raise ValueError(f"terms must be a bool tensor [head, query, key], got {terms.dtype} {tuple(terms.shape)}")
    if scores.ndim != 3 or scores.shape[0] not in (1, terms.shape[0]) or scores.shape[1:] != terms.shape[1:]:
        raise ValueError(
            f"scores {tuple(scores.shape)} must be [head, query, key] (head 1 or {terms.shape[0]}) like terms {tuple(terms.shape)}"
        )
    for k in fractions:
        if not 0.0 < float(k) <= 1.0:
            raise ValueError(f"fractions must be in (0, 1], got {k}")
    units = terms.any(0, keepdim=True) if scores.shape[0] == 1 else terms
    if not bool(torch.isfinite(scores[units]).all()):
        raise ValueError("scores must be finite on every term")
    fill = float("-inf") if largest else float("inf")  # non-terms rank after every term
    ranked = torch.where(units, scores, torch.full_like(scores, fill))
    rank, _, _ = removal_ranks(ranked[None], scope="query", largest=largest, allow_sink=True, allow_current=True)
    rank = rank[0]
    n_units = units.sum((0, 2))  # [query]
    out = []
    for k in fractions:
        take = _n_take(n_units, float(k))[None, :, None]
        out.append(((rank < take) & units).expand_as(terms) & terms)
    return out


def mask_hash(mask: Bool[Tensor, "head query key"]) -> str:
    """A 16-hex-digit digest of a mask (its shape and bits): equal digests, identical masks.

    >>> import torch
    >>> m = torch.zeros(2, 3, 3, dtype=torch.bool)
    >>> mask_hash(m) == mask_hash(m.clone()), mask_hash(m) == mask_hash(~m)
    (True, False)
    """
    bits = np.packbits(mask.detach().to("cpu", torch.bool).numpy().reshape(-1))
    digest = hashlib.blake2b(np.asarray(mask.shape, dtype=np.int64).tobytes(), digest_size=8)
    digest.update(bits.tobytes())
    return digest.hexdigest()


def masking_scores(
    view,
    metrics: Sequence[str],
    *,
    value_zeroing: Float[Tensor, "query key"] | None = None,
    random_seed: int | None = None,
) -> dict[str, Float[Tensor, "head query key"]]:
    """Each metric's scores of one layer of one sequence (``view``: the
    :class:`~geolens.adapter.AttentionLayer` of a batch of one), ``[head, query, key]``;
    Value Zeroing ``[1, query, key]`` (``value_zeroing``: its ``[query, key]`` scores of this
    layer); random: :func:`~geolens.interventions.masking.random_scores` of ``random_seed``.
    Per-layer metrics use their registered definitions (:mod:`geolens.metrics`) on
    ``LayerInputs.from_layer(view, mode)``, mode ``inter`` except for a mode-qualified name
    (:func:`geolens.metrics.mode_variant`: ``output_normalized_intra``).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model)[:1], names_filter=geolens.names_filter(model))
    >>> s = masking_scores(geolens.get_attention_layer(model, cache, 1), ["raw_attention", "random"], random_seed=0)
    >>> tuple(s["raw_attention"].shape), tuple(s["random"].shape)
    ((4, 20, 20), (4, 20, 20))
    """
    unknown = [m for m in metrics if m not in MASKING_METRICS]
    if unknown:
        raise ValueError(f"unknown masking metrics {unknown}; choose from {list(MASKING_METRICS)}")
    if view.pattern.shape[0] != 1:
        raise ValueError(f"masking_scores takes the layer of one sequence, got a batch of {view.pattern.shape[0]}")
    inputs: dict[str, LayerInputs] = {}
    out = {}
    for m in metrics:
        negated = sign_variant(m)
        if negated is not None:  # the opposite-sign control (−c: the most negative terms first)
            base = out[negated.name] if negated.name in out else masking_scores(view, [negated.name])[negated.name]
            out[m] = -base
            continue
        metric, mode = mode_variant(m) or (find_metric(m), "inter")
        if metric is not None and metric.per_layer:
            if mode not in inputs:
                inputs[mode] = LayerInputs.from_layer(view, mode)
            out[m] = metric.layer_scores(inputs[mode], False)[0].expand_as(view.pattern[0])
        elif m == "value_zeroing":
            if value_zeroing is None:
                raise ValueError("value_zeroing scores of the layer are needed for the value_zeroing metric")
            out[m] = value_zeroing.to(view.pattern)[None]
        else:  # random
            if random_seed is None:
                raise ValueError("random_seed is needed for the random metric")
            out[m] = random_scores(tuple(view.pattern.shape[1:]), seed=random_seed).to(view.pattern)
    return out


def layer_conditions(
    scores: dict[str, Tensor],
    terms: Bool[Tensor, "head query key"],
    fractions: Sequence[float],
    directions: Sequence[str] = DIRECTIONS,
) -> list[Condition]:
    """Every (metric, direction, k) of one layer (:func:`query_masks`), then the all-removed
    condition (every term, i.e. every α of the layer, zeroed).

    >>> import torch
    >>> terms = torch.ones(1, 2, 2, dtype=torch.bool).tril()
    >>> conditions = layer_conditions({"raw_attention": torch.rand(1, 2, 2)}, terms, [0.5])
    >>> [(c.metric, c.direction, c.k) for c in conditions]
    [('raw_attention', 'comprehensiveness', 0.5), ('raw_attention', 'sufficiency', 0.5), ('all_removed', 'all_removed', 1.0)]
    """
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad:
        raise ValueError(f"unknown directions {bad}; choose from {list(DIRECTIONS)}")
    out = []
    for metric, s in scores.items():
        for direction in directions:
            masks = query_masks(s, terms, fractions, largest=direction == "comprehensiveness")
            out += [Condition(metric, direction, float(k), m) for k, m in zip(fractions, masks)]
    out.append(Condition(ALL_REMOVED, ALL_REMOVED, 1.0, terms.clone()))
    return out


def distinct_masks(
    conditions: Sequence[Condition],
) -> tuple[list[str], Bool[Tensor, "n_distinct head query key"], list[int]]:
    """``(hashes, masks, row)``: each condition's :func:`mask_hash`, its distinct masks stacked in
    order of first appearance, and the row of ``masks`` each condition reads (identical masks
    run once).

    >>> import torch
    >>> m = torch.eye(3, dtype=torch.bool)[None]
    >>> hashes, masks, row = distinct_masks([Condition("a", "sufficiency", 0.1, m), Condition("b", "sufficiency", 0.1, m.clone())])
    >>> tuple(masks.shape), row
    ((1, 1, 3, 3), [0, 0])
    """
    hashes = [mask_hash(c.mask) for c in conditions]
    first: dict[str, int] = {}
    distinct = []
    for c, h in zip(conditions, hashes):
        if h not in first:
            first[h] = len(distinct)
            distinct.append(c.mask)
    if not distinct:
        raise ValueError("no conditions")
    return hashes, torch.stack(distinct), [first[h] for h in hashes]


# ---------------------------------------------------------------------------------------------
# One document


def unigram_logprobs(model, texts: Sequence[str]) -> Float[Tensor, "d_vocab"]:
    """log u(t), the corpus unigram distribution of the model's tokens over ``texts`` with add-one
    smoothing (float64): u(t) = (count(t) + 1) / (N + V), N the number of tokens of all texts
    (the model's tokenizer, no special tokens), V = ``model.cfg.d_vocab``.

    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> u = unigram_logprobs(model, ["abba", "a"])  # 'a' 3 times, 'b' twice, N = 5, V = 64
    >>> round(float(u.exp().sum()), 12), round(float(u[model.tokenizer("a")["input_ids"][-1]].exp() * 69), 6)
    (1.0, 4.0)
    """
    if isinstance(texts, str) or not len(texts):
        raise ValueError("texts must be a non-empty list of strings")
    V = int(model.cfg.d_vocab)
    counts = torch.zeros(V, dtype=torch.float64)
    for text in texts:
        ids = torch.as_tensor(model.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        if ids.numel() and int(ids.max()) >= V:
            raise ValueError(f"the tokenizer gives token id {int(ids.max())}, outside the model's vocabulary of {V}")
        counts += torch.bincount(ids, minlength=V).to(torch.float64)
    return torch.log(counts + 1.0) - math.log(float(counts.sum()) + V)


def _check_protocol(protocol) -> dict:
    second = protocol["secondary"]
    wrong = {
        key: second.get(key)
        for key, want in (("masking_scope", "layer"), ("ranking_scope", "query"), ("start_at_layer", True))
        if second.get(key) != want
    }
    if wrong:
        raise ValueError(
            f"layer masking implements protocol 2's per-layer query-ranked masking; this protocol has {wrong}"
        )
    return second


def protocol_metrics(protocol) -> list[str]:
    """The metrics masked under ``protocol``: ``secondary.metrics``, then any other metric of a
    pair that the masking endpoint forms (``output_normalized_inter`` of pair 3; gradient ×
    activation belongs to the per-term endpoint only).

    >>> import geolens, json, pathlib
    >>> twin = json.loads((pathlib.Path(geolens.__file__).parents[1] / "docs/faithfulness/protocol.json").read_text())
    >>> protocol_metrics(twin)[-1]
    'output_normalized_inter'
    """
    metrics = list(protocol["secondary"]["metrics"])
    for pair in protocol["pairs"]:
        for m in pair:
            if m not in metrics and m not in SECTION_2_ONLY:
                metrics.append(m)
    return metrics


def layer_masking_document(
    model,
    tokens: Int[Tensor, "1 pos"],
    document_index: int,
    *,
    protocol,
    unigram_logprobs: Float[Tensor, "d_vocab"] | None = None,
    batch_size: int = 16,
) -> pd.DataFrame:
    """The masking endpoint on one window (module docstring): one row per (layer, metric,
    direction, k) of the document's layers (:func:`masking_layers`, each distinct layer once),
    plus one all-removed row per layer.

    Columns (:data:`COLUMNS`): ``document``, ``layer``, ``metric``, ``direction``, ``k``;
    ``n_terms`` (terms of the layer, every query) and ``n_removed`` (terms the mask removes);
    ``kl``, ``delta_p``, ``nll``: the means over the scored positions (:func:`scored_positions`);
    ``clean_nll`` and ``unigram_ce`` (the unigram cross-entropy of the same next tokens, NaN
    without ``unigram_logprobs``: the ceiling check is then not made); ``mask_hash``
    (:func:`mask_hash`: equal for identical masks).

    ``protocol``: the parsed ``protocol.json`` (or :func:`geolens.faithfulness.preregistered.load_protocol`'s
    object): its fractions, directions, metrics (:func:`protocol_metrics`) and scored positions.
    One clean ``run_with_cache`` gives every score (Value Zeroing: one
    :func:`~geolens.faithfulness.value_zeroing` call for the document's layers); the masked
    forwards start at each layer (:func:`masked_outcomes`), ``batch_size`` conditions per forward,
    identical masks of a layer run once.

    >>> import geolens, json, pathlib
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> twin = json.loads((pathlib.Path(geolens.__file__).parents[1] / "docs/faithfulness/protocol.json").read_text())
    >>> twin["secondary"]["scored_positions"] = [4, 16, 4]  # a short window
    >>> model = tiny_bridge("gqa", n_layers=3)
    >>> rows = layer_masking_document(model, tiny_tokens(model)[:1], 0, protocol=twin)
    >>> sorted(set(rows.layer)), len(rows)  # 3 layers × (8 metrics × 2 directions × 5 k + 1)
    ([0, 1, 2], 243)
    """
    from geolens.faithfulness.value_zeroing import value_zeroing

    second = _check_protocol(protocol)
    tokens = check_tokens(model, tokens)
    document_index = _check_index(document_index)
    positions = scored_positions(protocol)
    n_pos = tokens.shape[1]
    if positions[-1] > n_pos - 2:
        raise ValueError(
            f"the last scored position {positions[-1]} needs a window of at least {positions[-1] + 2} tokens, got {n_pos}"
        )
    fractions = [float(k) for k in second["fractions"]]
    directions = list(second["directions"])
    metrics = protocol_metrics(protocol)
    if unigram_logprobs is not None and tuple(unigram_logprobs.shape) != (int(model.cfg.d_vocab),):
        raise ValueError(f"unigram_logprobs must be [d_vocab={model.cfg.d_vocab}], got {tuple(unigram_logprobs.shape)}")
    per_document = int(second.get("n_layers_per_document", 3))
    layers = list(dict.fromkeys(masking_layers(document_index, model.cfg.n_layers, per_document)))
    adapter = adapter_for(model)
    wanted = names_filter(model, layers)
    resid_names = {adapter.resid_pre_hook(l) for l in layers}
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda name: wanted(name) or name in resid_names)
    clean_logits = logits[0, positions]
    following = tokens[0, torch.tensor(positions) + 1]
    clean_nll = float(
        -torch.log_softmax(clean_logits.to(torch.float64), -1)[
            torch.arange(len(positions)), following.to(clean_logits.device)
        ].mean()
    )
    unigram_ce = (
        float("nan") if unigram_logprobs is None else float(-unigram_logprobs.to(torch.float64)[following.cpu()].mean())
    )
    vz = (
        value_zeroing(model, tokens, layers) if "value_zeroing" in metrics else None
    )  # [layer, 1, query, key], layers sorted
    vz_layers = sorted(layers)
    rows = []
    for layer in layers:
        view = get_attention_layer(model, cache, layer)
        terms = view.pattern[0] != 0
        scores = masking_scores(
            view,
            metrics,
            value_zeroing=None if vz is None else vz[vz_layers.index(layer), 0],
            random_seed=masking_random_seed(document_index, layer),
        )
        conditions = layer_conditions(scores, terms, fractions, directions)
        hashes, masks, row_of = distinct_masks(conditions)
        measured = masked_outcomes(
            model,
            tokens,
            layer,
            masks,
            positions,
            clean_logits,
            resid_pre=cache[adapter.resid_pre_hook(layer)],
            batch_size=batch_size,
        )
        means = {k: v.mean(1) for k, v in measured.items()}
        n_terms = int(terms.sum())
        for c, h, u in zip(conditions, hashes, row_of):
            rows.append(
                dict(
                    document=document_index,
                    layer=int(layer),
                    metric=c.metric,
                    direction=c.direction,
                    k=c.k,
                    n_terms=n_terms,
                    n_removed=int(c.mask.sum()),
                    kl=float(means["kl"][u]),
                    delta_p=float(means["delta_p"][u]),
                    nll=float(means["nll"][u]),
                    clean_nll=clean_nll,
                    unigram_ce=unigram_ce,
                    mask_hash=h,
                )
            )
    del cache
    return pd.DataFrame(rows, columns=list(COLUMNS))


__all__ = [
    "ALL_REMOVED",
    "COLUMNS",
    "Condition",
    "MASKING_METRICS",
    "distinct_masks",
    "layer_conditions",
    "layer_masking_document",
    "mask_hash",
    "masked_outcomes",
    "masking_layers",
    "masking_random_seed",
    "masking_scores",
    "protocol_metrics",
    "query_masks",
    "scored_positions",
    "unigram_logprobs",
]
