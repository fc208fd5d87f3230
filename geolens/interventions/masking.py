"""Causal masking of attention terms through ``hook_pattern`` (docs/method.md §3;
Cunningham & Muça Cirone 2026 §2.3).

For layer l, head h and query i, removing source j deletes the term α_ij^h ṽ_j^h from the head
output o_i^h = Σ_j α_ij^h ṽ_j^h. It is done by setting α_ij^h to 0 in ``hook_pattern``
**without renormalising** the row, so that what remains is exactly Σ_{j kept} α_ij^h ṽ_j^h
(the same as masking the projected value ṽ_j for that query only). Nothing upstream of the
pattern changes; every later layer sees the edited output.

Masks are boolean ``remove`` tensors ``[layer, batch, head, query, key]`` (True = remove), one
slice per layer of ``layers``; the head axis may be 1 (one mask for every head, e.g. Value
Zeroing scores) and the batch axis may be 1 (one mask for every row).

Batched masks: many masks of **one** sequence run in one forward pass. The sequence is run once
up to the first masked layer, and the batch is expanded to ``n_masks`` rows at that layer's
``hook_resid_pre`` (everything before it is identical for every mask), so a whole curve costs a
few forwards, most of them only over the masked part of the network.

- :func:`removal_mask`: which sources to remove from a metric tensor (top-k% or bottom-k% of each
  (head, query) row among the eligible sources; the sink and the current token may be protected).
- :func:`removal_ranks` / :func:`mask_from_ranks`: the same for any ranking scope (``row``: per
  (layer, head, query); ``query``: all (head, source) terms of one query on a common scale;
  ``source``: one score per (query, source) summed over heads, removed in every head), ranked
  once and thresholded per fraction.
- :func:`pattern_mask_hooks`: the ``fwd_hooks`` that zero α of removed sources.
- :func:`branch_hook`: expand a batch of one at a layer.
- :func:`masked_token_nll`: per-position next-token NLL of one sequence under many masks.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from geolens.adapter import PATTERN, adapter_for, hook_name, unembed_input_hook
from geolens.interventions.base import FwdHooks, applied
from geolens.validation import out_of_range

RankingScope = Literal["row", "query", "source"]
RANKING_SCOPES: tuple[str, ...] = get_args(RankingScope)


def eligible_sources(
    n_query: int,
    n_key: int,
    *,
    allow_sink: bool,
    allow_current: bool,
    device: torch.device | str | None = None,
) -> Bool[Tensor, "query key"]:
    """Sources j a query i may lose: causal j ≤ i, minus j = 0 and/or j = i when protected.

    Queries and keys are aligned at the end (query i is key position i + n_key − n_query).
    """
    offset = n_key - n_query
    i = torch.arange(n_query, device=device)[:, None] + offset
    j = torch.arange(n_key, device=device)[None, :]
    ok = j <= i
    if not allow_sink:
        ok &= j != 0
    if not allow_current:
        ok &= j != i
    return ok


def removal_mask(
    scores: Float[Tensor, "*lead query key"],
    fraction: float,
    *,
    largest: bool = True,
    allow_sink: bool = False,
    allow_current: bool = False,
) -> Bool[Tensor, "*lead query key"]:
    """Remove the top (``largest=True``) or bottom ``fraction`` of each query's eligible sources.

    For each row (…, query i) with n_i eligible sources (:func:`eligible_sources`), the
    ⌊fraction · n_i + 1/2⌋ sources with the largest (or smallest) score are removed. Scores are
    ranked as signed values (a negative contribution weight is "least important"); ties are
    broken by increasing source index (stable sort). Ineligible sources are never removed.

    Comprehensiveness uses ``largest=True`` (remove the most important), sufficiency
    ``largest=False`` (remove the least important), docs/method.md §3.

    >>> scores = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.2, 0.0], [0.1, 0.9, 0.3]])  # [query, key]
    >>> removal_mask(scores, 0.5, allow_sink=True).int()  # half of each query's earlier sources, top first
    tensor([[0, 0, 0],
            [1, 0, 0],
            [0, 1, 0]], dtype=torch.int32)
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if scores.ndim < 2:
        raise ValueError(f"scores must end with [query, key] axes, got shape {tuple(scores.shape)}")
    # one group per (…, query i): the "row" scope of removal_masks with a head axis of 1
    [mask] = removal_masks(
        scores[..., None, :, :],
        [fraction],
        scope="row",
        largest=largest,
        allow_sink=allow_sink,
        allow_current=allow_current,
    )
    return mask.expand(*scores.shape[:-2], 1, *scores.shape[-2:])[..., 0, :, :]


def removal_ranks(
    scores: Float[Tensor, "*lead head query key"],
    *,
    scope: RankingScope = "row",
    largest: bool = True,
    allow_sink: bool = False,
    allow_current: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Rank every removable term once; ``mask_from_ranks`` then gives the mask of any fraction.

    Scopes (the set of terms ranked together, docs/method.md §3):

    - ``"row"``: the eligible sources j of one (…, head, query i), as :func:`removal_mask`;
    - ``"query"``: all eligible (head h, source j) terms of one (…, query i), on the scale the
      scores have (a head axis of 1 means one score per source for every head: the query's
      sources are then removed in every head, in rank order);
    - ``"source"``: one score per (…, query i, source j), the sum of the scores over heads (a
      head axis of 1 is taken as already summed); a removed source is removed in every head.

    Returns ``(rank, n_eligible, eligible)``: ``rank`` (same shape as the scores, or head axis 1
    for ``"source"``) is the position of each term in its group's ranking (0 = removed first),
    ``n_eligible`` the number of eligible terms of the group (broadcastable), ``eligible`` the
    eligibility mask (broadcastable). Ties are broken by increasing source index, then head.
    """
    ranked, n_ok, ok, _, unflatten = _ranking_rows(scores, scope, largest, allow_sink, allow_current)
    rank = _inverse_permutation(torch.sort(ranked, dim=-1, descending=largest, stable=True).indices)
    return unflatten(rank), n_ok, ok


def removal_masks(
    scores: Float[Tensor, "*lead head query key"],
    fractions: Sequence[float],
    *,
    scope: RankingScope = "row",
    largest: bool = True,
    allow_sink: bool = False,
    allow_current: bool = False,
) -> list[Bool[Tensor, "..."]]:
    """``mask_from_ranks(*removal_ranks(scores, ...), k)`` for each k in ``fractions``, the same
    masks bit for bit, computed the cheaper way: one full ranking for many fractions, else per
    fraction a selection of the top ⌊k·n + 1/2⌋ terms of each group (:func:`torch.topk` for the
    threshold value, ties at it taken by increasing position, as the stable sort takes them),
    which avoids sorting every group when only a few fractions are asked for.
    """
    for k in fractions:
        if not 0.0 <= k <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {k}")
    if len(fractions) > 2:
        ranks = removal_ranks(scores, scope=scope, largest=largest, allow_sink=allow_sink, allow_current=allow_current)
        return [mask_from_ranks(*ranks, k) for k in fractions]
    ranked, n_ok, _, row_ok, unflatten = _ranking_rows(scores, scope, largest, allow_sink, allow_current)
    return [unflatten(_top_terms(ranked, _n_remove(n_ok, k), largest) & row_ok) for k in fractions]


def _n_remove(n_eligible: Tensor, fraction: float) -> Tensor:
    return torch.floor(n_eligible.to(torch.float64) * fraction + 0.5).to(torch.int32)


def _top_terms(ranked: Tensor, n: Tensor, largest: bool) -> Bool[Tensor, "..."]:
    """The first ``n`` terms of each row (``n`` broadcasts over rows) in the order of a stable sort
    of ``ranked`` (descending when ``largest``): the terms beyond the n-th value, plus the terms
    equal to it in order of position until n are taken."""
    n = n.expand(*ranked.shape[:-1], 1)
    most = int(n.max()) if n.numel() else 0
    if most == 0:
        return torch.zeros(ranked.shape, dtype=torch.bool, device=ranked.device)
    top = torch.topk(ranked, most, dim=-1, largest=largest, sorted=True).values  # [..., most]
    threshold = top.gather(-1, (n.long() - 1).clamp_min(0))  # the n-th value of each row
    beyond = ranked > threshold if largest else ranked < threshold
    at = ranked == threshold
    need = n - beyond.sum(-1, keepdim=True, dtype=torch.int32)
    taken = beyond | (at & (at.cumsum(-1, dtype=torch.int32) <= need))
    return taken & (n > 0)


def _ranking_rows(scores: Tensor, scope: str, largest: bool, allow_sink: bool, allow_current: bool):
    """(rows to rank with ineligible terms at the far end, eligible count per row, eligibility
    ``[query, key]``, the same eligibility in row layout, the map from row layout back to the
    scores' layout) for :func:`removal_ranks` and :func:`removal_masks`."""
    if scope not in RANKING_SCOPES:
        raise ValueError(f"unknown ranking scope {scope!r}; choose from {list(RANKING_SCOPES)}")
    if scores.ndim < 3:
        raise ValueError(f"scores must end with [head, query, key] axes, got shape {tuple(scores.shape)}")
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN; rank a finite metric")
    if scope == "source" and scores.shape[-3] != 1:
        scores = scores.sum(-3, keepdim=True)
    n_h, n_q, n_k = scores.shape[-3:]
    ok = eligible_sources(n_q, n_k, allow_sink=allow_sink, allow_current=allow_current, device=scores.device)
    fill = float("-inf") if largest else float("inf")
    if scope == "query" and n_h > 1:
        # [..., head, q, k] -> [..., q, k, head] -> [..., q, k·head]: key-major, so ties between the
        # heads of one source stay together and the lower source index goes first
        flat = scores.movedim(-3, -1).reshape(*scores.shape[:-3], n_q, n_k * n_h)
        row_ok = ok[:, :, None].expand(n_q, n_k, n_h).reshape(n_q, n_k * n_h)
        ranked = torch.where(row_ok, flat, torch.full_like(flat, fill))
        lead = scores.shape[:-3]

        def unflatten(x: Tensor) -> Tensor:
            return x.expand(*lead, n_q, n_k * n_h).reshape(*lead, n_q, n_k, n_h).movedim(-1, -3).contiguous()

        return ranked, (ok.sum(-1) * n_h)[None, :, None], ok, row_ok, unflatten
    ranked = torch.where(ok, scores, torch.full_like(scores, fill))
    return ranked, ok.sum(-1)[:, None], ok, ok, lambda x: x


def _inverse_permutation(order: Tensor) -> Tensor:
    """rank[..., order[..., i]] = i: each term's position in the sorted order, by one scatter
    (the same as a second argsort, without its O(n log n) sort)."""
    positions = torch.arange(order.shape[-1], dtype=torch.int32, device=order.device).expand(order.shape)
    return torch.empty(order.shape, dtype=torch.int32, device=order.device).scatter_(-1, order, positions)


def mask_from_ranks(rank: Tensor, n_eligible: Tensor, eligible: Tensor, fraction: float) -> Bool[Tensor, "..."]:
    """Remove the first ⌊fraction · n + 1/2⌋ terms of each group ranked by :func:`removal_ranks`."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    return (rank < _n_remove(n_eligible, fraction)) & eligible


def random_scores(shape: Sequence[int], *, seed: int, device=None) -> Float[Tensor, "..."]:
    """Uniform random scores: the ranking floor of a faithfulness curve (seeded, reproducible)."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return (
        torch.rand(tuple(shape), generator=g).to(device)
        if device is not None
        else torch.rand(tuple(shape), generator=g)
    )


def _check_remove(remove: Tensor, layers: Sequence[int], n_heads: int) -> None:
    if remove.dtype != torch.bool:
        raise TypeError(f"remove must be a bool tensor (True = remove), got {remove.dtype}")
    if remove.ndim != 5:
        raise ValueError(
            f"remove must be [layer, batch, head, query, key] (head may be 1), got shape {tuple(remove.shape)}"
        )
    if remove.shape[0] != len(layers):
        raise ValueError(f"remove has {remove.shape[0]} layer slices but {len(layers)} layers were given")
    if remove.shape[2] not in (1, n_heads):
        raise ValueError(f"remove has {remove.shape[2]} heads; use 1 (all heads) or n_heads={n_heads}")


def require_pattern_hooks(model, layers: Sequence[int]) -> None:
    """A one-line ``ValueError`` unless every layer has ``blocks.{l}.attn.hook_pattern`` to edit."""
    hook_dict = getattr(model, "hook_dict", None)
    missing = [
        hook_name(l, PATTERN) for l in layers if hook_dict is not None and hook_name(l, PATTERN) not in hook_dict
    ]
    if missing:
        raise ValueError(f"this model has no {missing[0]}: masking needs the attention-pattern hook (eager attention)")


def pattern_mask_hooks(
    model,
    remove: Bool[Tensor, "layer batch head query key"],
    layers: Sequence[int],
) -> FwdHooks:
    """``fwd_hooks`` setting α_ij^h = 0 in ``hook_pattern`` where ``remove`` is True (no renormalisation).

    ``remove[n]`` is the mask of layer ``layers[n]``; its batch axis must equal the pattern's
    batch or be 1, its head axis n_heads or 1.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)  # [2, 20]
    >>> remove = torch.zeros(1, 1, 1, 20, 20, dtype=torch.bool)  # [layer, batch, head, query, key]
    >>> remove[..., 5:, 1] = True  # α_i1 = 0 for every query i ≥ 5, every head
    >>> with applied(model, pattern_mask_hooks(model, remove, layers=[1])):
    ...     masked = model(tokens)
    >>> bool((masked != model(tokens)).any())
    True
    """
    layers = [int(l) for l in layers]
    if len(set(layers)) != len(layers):
        raise ValueError(f"layers must be distinct, got {layers}")
    for l in layers:
        if not 0 <= l < model.cfg.n_layers:
            raise IndexError(out_of_range(f"layer {l}", model.cfg.n_layers, "layers", allow_negative=False))
    _check_remove(remove, layers, model.cfg.n_heads)
    require_pattern_hooks(model, layers)

    def make(mask: Tensor):
        def hook(pattern: Tensor, hook) -> Tensor:
            b, h, q, k = pattern.shape
            if mask.shape[0] not in (1, b) or mask.shape[-2:] != (q, k):
                raise ValueError(f"{hook.name}: mask {tuple(mask.shape)} does not fit pattern {tuple(pattern.shape)}")
            return pattern.masked_fill(mask.to(pattern.device), 0.0)

        return hook

    return [(hook_name(l, PATTERN), make(remove[n])) for n, l in enumerate(layers)]


def branch_hook(model, layer: int, n_rows: int) -> tuple[str, callable]:
    """A hook expanding a batch of one to ``n_rows`` identical rows where block ``layer`` starts
    (its ``hook_resid_pre``, :meth:`geolens.adapter.ModelAdapter.resid_pre_hook`).

    Everything before ``layer`` then runs once; per-row interventions at ``layer`` and later see
    ``n_rows`` copies. The logits come back with ``n_rows`` rows. Only a batch of one can branch:
    the TransformerBridge builds its attention mask with the input's batch size, which broadcasts
    from 1 but not from B > 1.
    """

    def hook(resid: Tensor, hook) -> Tensor:
        if resid.shape[0] != 1:
            raise ValueError(f"branch_hook expects a batch of one at {hook.name}, got {resid.shape[0]} rows")
        return resid.expand(n_rows, *resid.shape[1:]).contiguous()

    return (adapter_for(model).resid_pre_hook(layer), hook)


def token_nll(
    logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos_minus_1"]:
    """Next-token negative log-likelihood −log p(t_{i+1} | t_≤i), in float32."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -logp.gather(-1, tokens[:, 1:, None].to(logp.device)).squeeze(-1)


def last_predictions_hook(model, n_pos: int, n_scored: int) -> tuple[str, callable]:
    """Keep only the positions whose logits predict the last ``n_scored`` tokens.

    Sliced just before the unembedding (:func:`geolens.adapter.unembed_input_hook`): logits come
    back as ``[batch, n_scored, vocab]`` for positions n_pos − 1 − n_scored … n_pos − 2, and the
    unembedding of the other positions (a large share of a small model's forward) is skipped.
    """
    if not 1 <= n_scored <= n_pos - 1:
        raise ValueError(f"n_scored must be in [1, {n_pos - 1}], got {n_scored}")

    def hook(x: Tensor, hook) -> Tensor:
        return x[:, n_pos - 1 - n_scored : n_pos - 1].contiguous()

    return (unembed_input_hook(model), hook)


def masked_token_nll(
    model,
    tokens: Int[Tensor, "1 pos"],
    remove: Bool[Tensor, "layer n_masks head query key"],
    layers: Sequence[int],
    *,
    chunk_size: int = 16,
    branch: bool = True,
    n_scored: int | None = None,
) -> Float[Tensor, "n_masks scored"]:
    """Next-token NLL of one sequence under each of ``n_masks`` masks, batched.

    Masks are run ``chunk_size`` at a time; with ``branch=True`` each chunk runs the prefix before
    the first masked layer once (:func:`branch_hook`), which gives identical results (tested) at a
    fraction of the cost. ``n_scored`` keeps only the last that many predictions (all pos − 1 by
    default; see :func:`last_predictions_hook`).
    """
    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(f"tokens must be one sequence [1, pos], got shape {tuple(tokens.shape)}")
    layers = [int(l) for l in layers]
    _check_remove(remove, layers, model.cfg.n_heads)
    n_masks = remove.shape[1]
    n_pos = tokens.shape[1]
    first = min(layers) if layers else 0
    tail = [] if n_scored is None else [last_predictions_hook(model, n_pos, n_scored)]
    out = []
    with torch.no_grad():
        for start in range(0, n_masks, chunk_size):
            chunk = remove[:, start : start + chunk_size]
            n = chunk.shape[1]
            hooks = list(pattern_mask_hooks(model, chunk, layers)) + tail
            if branch:
                hooks = [branch_hook(model, first, n)] + hooks
                inp = tokens
            else:
                inp = tokens.expand(n, -1)
            with applied(model, hooks):
                logits = model(inp, return_type="logits")
            out.append(tail_nll(logits, tokens.expand(n, -1)))
            del logits
    return torch.cat(out) if out else torch.zeros(0, n_scored or n_pos - 1)


def tail_nll(
    logits: Float[Tensor, "batch scored vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch scored"]:
    """NLL of the last ``scored`` tokens from logits of the positions that predict them
    (``scored = pos − 1`` is :func:`token_nll`)."""
    n_scored = logits.shape[1]
    if n_scored == tokens.shape[1]:  # full logits: drop the last position's prediction
        return token_nll(logits, tokens)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, tokens[:, -n_scored:, None].to(logp.device)).squeeze(-1)


def perplexity(nll: Float[Tensor, "... pos"]) -> Float[Tensor, "..."]:
    """exp(mean NLL) over the last axis."""
    return torch.exp(nll.mean(-1))


def n_removed(fraction: float, n_eligible: int) -> int:
    """⌊fraction · n + 1/2⌋, the count :func:`removal_mask` removes from a row of n eligible sources."""
    return int(math.floor(fraction * n_eligible + 0.5))
