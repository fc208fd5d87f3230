"""The geometry core: the one home of the Gram matrix, the norms it gives and query chunking.

docs/method.md §1–2. With W_O^h ``[head, d_head, d_model]`` the output map of head h, the projected
value of source j is ṽ_j^h = v_j^h W_O^h and the head output o_i^h = z_i^h W_O^h. The efficient
form (docs/method.md §2) never builds a ``d_model`` vector per (head, query, key): with the Gram
matrix

    G^h = W_O^h W_O^{hT}   ``[head, d_head, d_head]``

inner products and norms of projected vectors are quadratic forms in ``d_head``:

    ⟨x W_O^h, y W_O^h⟩ = x G^h yᵀ,    ‖ṽ_j^h‖² = v_j^h G^h v_j^{hT},    ‖o_i^h‖² = z_i^h G^h z_i^{hT}.

- :func:`gram` is the only place that computes G (cached per W_O tensor, see there);
- :func:`gram_apply`, :func:`gram_dot` and :func:`gram_cosine` are the inner product x G yᵀ and
  the cosine it gives, for vectors in any layout (G broadcast over their leading axes; no G: the
  plain inner product of the value space, before W_O);
- :func:`gram_norm` is the quadratic form sqrt(x G xᵀ) for any ``[..., head, d_head]`` vectors;
- :func:`projected_value_norms`, :func:`head_output_norms`, :func:`head_outputs` and
  :func:`layer_output` apply them to an :class:`~geolens.adapter.AttentionLayer`;
- :func:`query_chunk_for_budget`, :func:`iter_query_chunks` and :func:`fill_query_chunks` split
  the queries of a layer so that ``[batch, head, query, key]`` temporaries stay within a budget
  (docs/method.md §2: each query row is computed on its own, so chunked results equal the
  unchunked ones up to the rounding of the matmul kernels, which may differ with the chunk size).

Callers that need a subset of positions slice the vectors before the quadratic form (each
position is its own computation).
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterator, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import AttentionLayer

# How many [batch, head, chunk, key] temporaries the efficient form keeps alive at once
# (measured in tests/test_long_context.py): contribution weights of one mode, all metrics.
CONTRIBUTION_TEMPORARIES = 3
METRIC_TEMPORARIES = 6

# id(W_O) -> (weak reference to W_O, its state when G was computed, G); _CROSS_GRAMS likewise for
# the cross-head Gram. An entry leaves when its
# W_O is freed, so an id is never matched against another tensor.
_GRAMS: dict[int, tuple[weakref.ref, tuple, Tensor]] = {}
_CROSS_GRAMS: dict[int, tuple[weakref.ref, tuple, Tensor]] = {}


def _state(W_O: Tensor) -> tuple | None:
    """What must not change for a cached G to stay valid, or None when W_O cannot be cached.

    The version counter (shared by ``detach()`` views and the parameter they come from) moves on
    every in-place edit; storage, layout, dtype and device catch ``.data`` reassignment. Tensors
    that need gradients are never cached (a cached G would carry a stale autograd graph), nor are
    inference tensors (they keep no version counter).
    """
    if W_O.requires_grad:
        return None
    try:
        version = W_O._version
    except RuntimeError:
        return None
    return (W_O.data_ptr(), W_O.storage_offset(), tuple(W_O.shape), W_O.stride(), W_O.dtype, W_O.device, version)


def _forget(ref: weakref.ref, key: int, table: dict) -> None:
    entry = table.get(key)
    if entry is not None and entry[0] is ref:
        del table[key]


def gram(W_O: Float[Tensor, "head d_head d_model"], *, cross_heads: bool = False) -> Tensor:
    """G^h = W_O^h W_O^{hT} per head ``[head, d_head, d_head]`` (docs/method.md §2, efficient form):
    the only place it is computed. ``cross_heads=True`` gives every pair of heads at once,
    G^{h'h} = W_O^{h'} W_O^{hT} as one ``[head·d_head, head·d_head]`` matrix, whose diagonal blocks
    are the per-head G^h: with it, o_i W_O^{hT} = Σ_{h'} z_i^{h'} G^{h'h} without building o_i.

    The result is cached on the identity of the ``W_O`` tensor and recomputed when that tensor
    changes (in-place edits move its version counter; a new tensor is a new key), so every quantity
    of one :class:`~geolens.adapter.AttentionLayer` (and of its query chunks, which share ``W_O``)
    reuses one G. A ``W_O`` that requires grad is never cached. Do not edit the returned tensor.

    >>> import torch
    >>> W_O = torch.randn(4, 8, 32, dtype=torch.float64)
    >>> G = gram(W_O)
    >>> tuple(G.shape), torch.allclose(G[1], W_O[1] @ W_O[1].T), gram(W_O) is G
    ((4, 8, 8), True, True)
    """
    state = _state(W_O)
    key, table = id(W_O), (_CROSS_GRAMS if cross_heads else _GRAMS)
    if state is not None:
        entry = table.get(key)
        if entry is not None and entry[0]() is W_O and entry[1] == state:
            return entry[2]
    if cross_heads:
        flat = W_O.reshape(-1, W_O.shape[-1])
        G = flat @ flat.T
    else:
        G = torch.einsum("hdm,hem->hde", W_O, W_O)
    if state is not None:
        table[key] = (
            weakref.ref(W_O, lambda ref, key=key, table=table, forget=_forget: forget(ref, key, table)),
            state,
            G,
        )
    return G


def gram_norm(
    x: Float[Tensor, "*batch head d_head"], G: Float[Tensor, "head d_head d_head"]
) -> Float[Tensor, "*batch head"]:
    """‖x^h W_O^h‖ = sqrt(x^h G^h x^{hT}) for vectors x ``[..., head, d_head]`` (docs/method.md §2).

    Rounding can make the quadratic form slightly negative for a vector in (or near) the kernel of
    W_O; it is clamped at 0 before the square root, so the result is never NaN.

    >>> import torch
    >>> W_O, x = torch.randn(4, 8, 32, dtype=torch.float64), torch.randn(3, 4, 8, dtype=torch.float64)
    >>> explicit = torch.einsum("bhd,hdm->bhm", x, W_O).norm(dim=-1)
    >>> torch.allclose(gram_norm(x, gram(W_O)), explicit)
    True
    """
    return torch.einsum("...hd,hde,...he->...h", x, G, x).clamp_min(0).sqrt()


def gram_apply(x: Float[Tensor, "*batch d_head"], G: Tensor | None) -> Float[Tensor, "*batch d_head"]:
    """x G along the last axis (x unchanged when G is None, the plain inner product).

    G ``[..., d_head, d_head]`` broadcasts against the leading axes of x as einsum's ``...`` does:
    ``[head, d, d]`` for x ``[..., head, d]``, ``[head, 1, 1, d, d]`` for x ``[batch, head, q, k, d]``.
    """
    return x if G is None else torch.einsum("...d,...de->...e", x, G)


def gram_dot(
    x: Float[Tensor, "*batch d_head"], y: Float[Tensor, "*batch d_head"], G: Tensor | None = None
) -> Float[Tensor, "*batch"]:
    """⟨x W_O, y W_O⟩ = x G yᵀ along the last axis (docs/method.md §2); ⟨x, y⟩ when G is None.

    x and y broadcast against each other (e.g. the sink's ``[batch, 1, head, d]`` against every
    source's ``[batch, key, head, d]``); G as in :func:`gram_apply`.

    >>> W_O, x, y = (torch.randn(*s, dtype=torch.float64) for s in ((4, 8, 32), (3, 4, 8), (3, 4, 8)))
    >>> explicit = (torch.einsum("bhd,hdm->bhm", x, W_O) * torch.einsum("bhd,hdm->bhm", y, W_O)).sum(-1)
    >>> torch.allclose(gram_dot(x, y, gram(W_O)), explicit)
    True
    """
    return (gram_apply(x, G) * y).sum(-1)


def gram_cosine(
    x: Float[Tensor, "*batch d_head"],
    y: Float[Tensor, "*batch d_head"],
    G: Tensor | None = None,
    *,
    eps: float | None = None,
) -> Float[Tensor, "*batch"]:
    """cos(x W_O, y W_O) = x G yᵀ / (‖x‖_G ‖y‖_G) along the last axis; cos(x, y) when G is None.

    ``eps=None``: NaN where either vector has zero norm (a direction it does not have; the corpus
    accumulators skip NaN). ``eps`` a number: x G yᵀ / (‖x‖_G ‖y‖_G + eps), 0 for a zero vector.
    Broadcasting and G as in :func:`gram_dot`.

    >>> W_O, x = torch.randn(4, 8, 32, dtype=torch.float64), torch.randn(3, 4, 8, dtype=torch.float64)
    >>> explicit = torch.nn.functional.cosine_similarity(torch.einsum("bhd,hdm->bhm", x, W_O), torch.einsum("hdm->hm", W_O), dim=-1)
    >>> torch.allclose(gram_cosine(x, torch.ones(4, 8, dtype=torch.float64), gram(W_O)), explicit)
    True
    >>> gram_cosine(torch.zeros(1, 2), torch.ones(1, 2))
    tensor([nan])
    """
    xg = gram_apply(x, G)
    dot = (xg * y).sum(-1)
    norms = (xg * x).sum(-1).clamp_min(0).sqrt() * gram_dot(y, y, G).clamp_min(0).sqrt()
    if eps is not None:
        return dot / (norms + eps)
    cos = dot / norms
    return torch.where(torch.isfinite(cos), cos, torch.full_like(cos, float("nan")))


def projected_value_norms(layer: AttentionLayer) -> Float[Tensor, "batch head key"]:
    """‖ṽ_j^h‖ = sqrt(v_j^h G^h v_j^{hT}) with G^h = W_O^h W_O^{hT} (docs/method.md §2, efficient form).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> layer = geolens.get_attention_layer(model, cache, 0)
    >>> explicit = torch.einsum("bkhd,hdm->bhkm", layer.v, layer.W_O).norm(dim=-1)
    >>> tuple(projected_value_norms(layer).shape), torch.allclose(projected_value_norms(layer), explicit, atol=1e-6)
    ((2, 4, 20), True)
    """
    return gram_norm(layer.v, gram(layer.W_O)).transpose(1, 2).contiguous()


def projected_values(model, cache=None, layer: int | None = None) -> Float[Tensor, "batch pos head d_model"]:
    """The projected values ṽ_j^h = v_j^h W_O^h ``[batch, pos, head, d_model]`` of one layer
    (docs/method.md §1): what source j would add to head h's output with all the attention on it.

    ``projected_values(model, cache, layer)`` reads the layer from a cache of
    ``model.run_with_cache(tokens, names_filter=geolens.names_filter(model))``; an
    :class:`~geolens.adapter.AttentionLayer` alone (``projected_values(layer)``) works too. With
    grouped-query attention v_j is that of the query head's kv head. Their norms are
    :func:`projected_value_norms` (computed there without forming the vectors:
    ``projected_values(...).norm(dim=-1)`` is its ``[batch, head, key]`` transposed).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads, d_model 32
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> vt = geolens.projected_values(model, cache, 0)
    >>> tuple(vt.shape)  # [batch, pos, head, d_model]
    (2, 20, 4, 32)
    >>> norms = geolens.projected_value_norms(geolens.get_attention_layer(model, cache, 0))
    >>> bool(torch.allclose(vt.norm(dim=-1).transpose(1, 2), norms, atol=1e-5))
    True
    """
    if isinstance(model, AttentionLayer):
        if cache is not None or layer is not None:
            raise TypeError("projected_values(layer) takes an AttentionLayer alone, or (model, cache, layer)")
        view = model
    else:
        if cache is None or layer is None:
            raise TypeError("projected_values needs (model, cache, layer), or an AttentionLayer alone")
        from geolens.adapter import get_attention_layer

        view = get_attention_layer(model, cache, layer)
    return torch.einsum("bkhd,hdm->bkhm", view.v, view.W_O.to(view.v.dtype))


def head_output_norms(layer: AttentionLayer, queries: slice = slice(None)) -> Float[Tensor, "batch query head"]:
    """‖o_i^h‖ = ‖z_i^h W_O^h‖ = sqrt(z_i^h G^h z_i^{hT}) (docs/method.md §1–2; b_O excluded).

    Layout as :func:`head_outputs` (``[batch, query, head]``); ``queries`` selects query positions
    before the quadratic form (e.g. ``slice(1, None)`` for every query after the sink).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> layer = geolens.get_attention_layer(model, cache, 0)
    >>> norms = head_output_norms(layer)
    >>> tuple(norms.shape), torch.allclose(norms, head_outputs(layer).norm(dim=-1), atol=1e-6)
    ((2, 20, 4), True)
    """
    return gram_norm(layer.z[:, queries], gram(layer.W_O))


def head_outputs(layer: AttentionLayer) -> Float[Tensor, "batch query head d_model"]:
    """o_i^h = z_i^h W_O^h, the per-head output before b_O (TL's ``hook_result`` minus b_O/H).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> layer = geolens.get_attention_layer(model, cache, layer=0)
    >>> tuple(geolens.head_outputs(layer).shape)  # [batch, query, head, d_model]
    (2, 20, 4, 32)
    """
    return torch.einsum("bqhd,hdm->bqhm", layer.z, layer.W_O)


def layer_output(layer: AttentionLayer) -> Float[Tensor, "batch query d_model"]:
    """o_i = Σ_h z_i^h W_O^h = ``attn.hook_out`` − b_O (b_O is never attributed, docs/method.md §1).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> tokens = tiny_tokens(model)
    >>> _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model, with_attn_out=True))
    >>> o = geolens.layer_output(geolens.get_attention_layer(model, cache, layer=0))
    >>> b_O = model.blocks[0].attn.b_O if model.blocks[0].attn.b_O is not None else 0
    >>> bool(((o + b_O) - cache["blocks.0.attn.hook_out"]).abs().max() < 1e-5)  # Σ_h z W_O + b_O = attention output
    True
    """
    return torch.einsum("bqhd,hdm->bqm", layer.z, layer.W_O)


def query_chunk_for_budget(
    layer: AttentionLayer, memory_budget_bytes: int, *, n_temporaries: int = CONTRIBUTION_TEMPORARIES
) -> int:
    """Largest query chunk whose ``[batch, head, chunk, key]`` temporaries fit the budget.

    One query row of one temporary takes ``batch · head · key · itemsize`` bytes; the efficient
    form keeps at most ``n_temporaries`` such tensors alive at once (3 for contribution weights,
    6 for :func:`geolens.factors.attention_metrics`, measured in
    ``tests/test_long_context.py``). The outputs themselves (``[batch, head, query, key]``, the
    size of the attention pattern) are not part of the budget. Raises if even one query row does
    not fit.
    """
    b, h, n_q, n_k = layer.pattern.shape
    row = b * h * n_k * torch.finfo(layer.pattern.dtype).bits // 8 * n_temporaries
    chunk = int(memory_budget_bytes) // row
    if chunk < 1:
        raise ValueError(
            f"memory_budget_bytes={memory_budget_bytes} is below the {row} bytes that one query row "
            f"needs (batch {b} × head {h} × key {n_k} × {n_temporaries} float temporaries)"
        )
    return min(chunk, n_q)


def split_query_chunk(
    layer: AttentionLayer,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    *,
    n_temporaries: int = CONTRIBUTION_TEMPORARIES,
) -> int | None:
    """The query chunk size to split ``layer`` by, or None when one pass covers every query.

    ``query_chunk_size`` is taken as given; ``memory_budget_bytes`` (not both) picks it through
    :func:`query_chunk_for_budget`. Raises for a chunk size below 1.
    """
    chunk = query_chunk_size
    if memory_budget_bytes is not None:
        if query_chunk_size is not None:
            raise ValueError("pass either query_chunk_size or memory_budget_bytes, not both")
        chunk = query_chunk_for_budget(layer, memory_budget_bytes, n_temporaries=n_temporaries)
    if chunk is None:
        return None
    if chunk < 1:
        raise ValueError("query_chunk_size must be a positive integer")
    return chunk if chunk < layer.pattern.shape[2] else None


def query_slices(start: int, stop: int, chunk: int) -> Iterator[slice]:
    """Consecutive slices of at most ``chunk`` positions covering ``start`` … ``stop − 1``.

    >>> list(query_slices(0, 5, 2))
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    if chunk < 1:
        raise ValueError("query_chunk_size must be a positive integer")
    for s in range(start, stop, chunk):
        yield slice(s, min(s + chunk, stop))


def iter_query_chunks(
    layer: AttentionLayer,
    *,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    n_temporaries: int = CONTRIBUTION_TEMPORARIES,
) -> Iterator[tuple[slice, AttentionLayer]]:
    """Yield ``(queries, sub_layer)``: the layer restricted to consecutive query ranges.

    For reductions over very long sequences that should never hold a ``[batch, head, query,
    key]`` result: compute and reduce per chunk, e.g. ``contribution_weights_from_layer(sub)``,
    so the extra memory is one chunk's temporaries (the chunk size comes from
    ``memory_budget_bytes`` through :func:`query_chunk_for_budget`, or is given; neither: one
    chunk of every query). The sub-layers share ``W_O`` and so one cached :func:`gram`.
    """
    n_q = layer.pattern.shape[2]
    chunk = split_query_chunk(layer, query_chunk_size, memory_budget_bytes, n_temporaries=n_temporaries) or n_q
    for queries in query_slices(0, n_q, chunk):
        yield queries, layer.query_slice(queries)


def fill_query_chunks(
    layer: AttentionLayer,
    query_chunk_size: int,
    compute: Callable[[AttentionLayer], Sequence[Tensor]],
    n_outputs: int,
) -> list[Tensor]:
    """Run ``compute`` on each query chunk of ``layer`` and write its ``[batch, head, chunk, key]``
    results into ``n_outputs`` preallocated ``[batch, head, query, key]`` tensors.

    The extra memory beyond the outputs is one chunk's temporaries; since every query row is
    computed on its own, the results equal one unchunked pass (up to matmul rounding, which can
    change with the number of rows).
    """
    outs = [torch.empty_like(layer.pattern) for _ in range(n_outputs)]
    for queries, sub in iter_query_chunks(layer, query_chunk_size=query_chunk_size):
        _write_chunk(outs, queries, compute(sub))
    return outs


def _write_chunk(outs: list[Tensor], queries: slice, parts: Sequence[Tensor]) -> None:
    for out, part in zip(outs, parts, strict=True):
        out[:, :, queries] = part
