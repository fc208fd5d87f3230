"""Contribution flow through the whole model: token-to-token attribution across layers
(docs/method.md §10).

For each layer l the residual stream after attention at position i decomposes over the source
positions j (x_i the residual entering the block, α the pattern, ṽ_j^h = v_j^h W_O^h):

    x̃_i = Σ_j t_ij,    t_ij = D_i (Σ_h α_ij^h ṽ_j^h) + [i = j] (x_i + D_i b_O),

where D_i is the identity, or, for a block with a post-attention norm (Gemma 2/3), that RMSNorm
at position i as the diagonal linear map it is once its per-position scale is fixed. The
layer's mixing matrix M^(l) (rows sum to 1) is read from the t_ij by one of

- ``"contribution"``: share_ij = ⟨x̃_i, t_ij⟩ / ‖x̃_i‖², negatives clipped to 0, rows renormalised;
- ``"alti"``: ALTI's proximity max(0, ‖x̃_i‖₁ − ‖t_ij − x̃_i‖₁), rows normalised
  (Ferrando, Gállego & Costa-jussà 2022);
- ``"attention_rollout"``: 0.5 · mean_h α + 0.5 · I (Abnar & Zuidema 2020);
- ``"value_zeroing_rollout"``: Value Zeroing scores of the layer, rows normalised (Mohebbi et al.
  2023; :func:`geolens.value_zeroing`, which reruns the model),

and composed through the attention layers, R^(l) = M^(l) R^(l−1), R^(0) = I
(:func:`contribution_flow`). The MLPs and norms act token by token and are not mixing.

Nothing of size ``[batch, query, key, head, d_model]`` is built: the contribution shares use
per-head projections u_i^h = (D_i x̃_i) W_O^{hT} / ‖x̃_i‖², so ⟨x̃_i, D_i α ṽ_j^h⟩ = α ⟨u_i^h, v_j^h⟩
(docs/method.md §2's inner-product form); ALTI needs the vectors t_ij themselves and builds them for
one block of queries at a time (``[batch, key, chunk, d_model]``). In a causal model the
composition runs in place: query blocks are taken from the last one down, so that the rows of R a
block reads (keys up to its last query) are still those of the previous layer, and only R and one
block's rows of M are alive.
"""

from __future__ import annotations

from typing import Callable, Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.adapter import (
    CAUSAL_BLOCK_ROWS,
    AttentionLayer,
    adapter_for,
    get_attention_layer,
    has_post_attention_norm,
    required_hook_names,
)
from geolens.finite import check_finite
from geolens.geometry import layer_output, query_slices, split_query_chunk
from geolens.validation import (
    check_attention_mask,
    check_cache_layers,
    check_dtype,
    check_layer,
    check_tokens,
    refuse_unmasked_padding,
)

FlowMethod = Literal["contribution", "alti", "attention_rollout", "value_zeroing_rollout"]
FLOW_METHODS: tuple[str, ...] = get_args(FlowMethod)


def check_flow_method(method) -> str:
    """``method`` when it is one of :data:`FLOW_METHODS`, else a one-line ValueError."""
    if not isinstance(method, str) or method not in FLOW_METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, FLOW_METHODS))}, got {method!r}")
    return method


def flow_hook_names(model, layers=None) -> list[str]:
    """The cache entries :func:`contribution_flow` reads: pattern, v and z of each layer
    (:func:`geolens.adapter.required_hook_names`), plus the residual entering each block and what its
    attention adds to the residual (after any post-attention norm)."""
    adapter = adapter_for(model)
    layers = range(model.cfg.n_layers) if layers is None else list(layers)
    names = required_hook_names(model, layers)
    for l in layers:
        names += [adapter.resid_pre_hook(l), adapter.block_attn_out_hook(l)]
    return names


def flow_names_filter(model, layers=None) -> Callable[[str], bool]:
    """A ``names_filter`` for ``run_with_cache`` keeping what :func:`contribution_flow` reads.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=flow_names_filter(model, [0]))
    >>> len(cache.keys())
    5
    """
    wanted = frozenset(flow_hook_names(model, layers))
    return lambda name: name in wanted


def cache_entry(cache, name: str) -> Tensor:
    """``cache[name]``, or a one-line KeyError saying which hook the flow needs (flow_names_filter)."""
    try:
        return cache[name]
    except KeyError:
        raise KeyError(
            f"the cache has no entry {name!r}: contribution_flow needs the residual stream too; run "
            "model.run_with_cache(tokens, names_filter=geolens.flow.flow_names_filter(model))"
        ) from None


def _row_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance per row for a rebuilt residual (the model's own rounding), as value_zeroing."""
    return max(1e-3, 50 * torch.finfo(dtype).eps)


def _post_norm_scale(
    pre: Float[Tensor, "batch query d_model"],
    post: Float[Tensor, "batch query d_model"],
    real: torch.Tensor,
    layer: int,
    tol: float,
    norm,
) -> Float[Tensor, "batch query d_model"]:
    """D_i with post_i = D_i ⊙ pre_i for a post-attention RMSNorm ``norm``, D_i = k_i w.

    w (up to a factor) is the norm's output for an all-ones input, read from the module itself, so
    that it is exact whatever the family's weight convention (Gemma's 1 + w); k_i = 1/rms(pre_i)
    (the common factor included) by least squares, k_i = ⟨post_i, w ⊙ pre_i⟩ / ‖w ⊙ pre_i‖². A
    norm that is not an elementwise scale of its input (one that centres, as LayerNorm) does not
    fit and is refused.
    """
    param = next(norm.parameters(), None)
    ones = torch.ones(1, 1, pre.shape[-1], dtype=param.dtype if param is not None else pre.dtype, device=pre.device)
    with torch.no_grad():
        w = norm(ones).reshape(-1).to(pre.dtype)
    wp = pre * w
    k = (post * wp).sum(-1, keepdim=True) / (wp * wp).sum(-1, keepdim=True).clamp_min(torch.finfo(pre.dtype).tiny)
    scale = k * w
    err = ((scale * pre - post).norm(dim=-1) / post.norm(dim=-1).clamp_min(1e-6))[real]
    if err.numel() and float(err.max()) > tol:
        raise NotImplementedError(
            f"layer {layer}: the post-attention norm is not an elementwise rescaling of its input "
            f"(RMSNorm) here (relative misfit {float(err.max()):.2g}); contribution_flow cannot split it over sources"
        )
    return scale


class LayerResidual:
    """One layer's residual decomposition x̃_i = Σ_j t_ij (docs/method.md §10), in ``dtype``.

    ``view`` is the :class:`~geolens.adapter.AttentionLayer` (padded positions zeroed),
    ``resid`` x_i, ``scale`` D_i (None: the identity), ``own`` = x_i + D_i b_O (the part of t_ii
    that does not come through attention; b_O is counted as position i's own) and ``mixed`` x̃_i.
    x̃_i is rebuilt from its terms and checked against the cache's x_i + attention update.
    """

    def __init__(self, model, cache, layer: int, *, dtype: torch.dtype = torch.float32, attention_mask=None):
        adapter = adapter_for(model)
        self.view: AttentionLayer = get_attention_layer(model, cache, layer, dtype=dtype, attention_mask=attention_mask)
        layer = self.view.layer
        x = cache_entry(cache, adapter.resid_pre_hook(layer))
        update = cache_entry(cache, adapter.block_attn_out_hook(layer))
        tol = _row_tolerance(x.dtype)
        b, n = x.shape[:2]
        real = (
            torch.ones(b, n, dtype=torch.bool, device=x.device)
            if self.view.query_mask is None
            else self.view.query_mask
        )
        self.real = real
        self.resid = x.to(dtype)
        update = update.to(dtype)
        pre = layer_output(self.view) + self.view.b_O  # Σ_h z W_O + b_O, the pre-norm attention output
        self.scale = (
            _post_norm_scale(pre, update, real, layer, tol, adapter.attention_output_norm(layer))
            if has_post_attention_norm(model)
            else None
        )
        self.own = self.resid + self._scaled(self.view.b_O.expand_as(pre))
        self.mixed = self.resid + self._scaled(pre)
        err = ((self.mixed - self.resid - update).norm(dim=-1) / (self.resid + update).norm(dim=-1).clamp_min(1e-6))[
            real
        ]
        if err.numel() and float(err.max()) > tol:
            raise RuntimeError(
                f"layer {layer}: x + Σ_h α v W_O + b_O differs from the cached residual after attention by "
                f"{float(err.max()):.2g} (relative); this block structure is not supported"
            )

    def _scaled(self, x: Tensor, queries: slice = slice(None)) -> Tensor:
        return x if self.scale is None else x * self.scale[:, queries]

    @property
    def projected_values(self) -> Float[Tensor, "batch key head d_model"]:
        """ṽ_j^h = v_j^h W_O^h (``[batch, key, head, d_model]``, no query axis), built once."""
        if "_vt" not in self.__dict__:
            self._vt = torch.einsum("bkhd,hdm->bkhm", self.view.v, self.view.W_O)
        return self._vt

    def terms(
        self, queries: slice = slice(None), k_end: int | None = None, *, minus_mixed: bool = False
    ) -> Float[Tensor, "batch key query d_model"]:
        """t_ij for the queries in ``queries`` and the keys below ``k_end``, laid out
        ``[batch, key, query, d_model]`` (one batched product over (batch, key) of the
        ``[query, head]`` attention with the ``[head, d_model]`` projected values); with
        ``minus_mixed``, t_ij − x̃_i (subtracted inside the product where there is no D_i)."""
        n = self.view.pattern.shape[-1]
        queries = slice(*queries.indices(self.view.pattern.shape[2]))
        k_end = n if k_end is None else k_end
        # [batch, key, query, head], contiguous: the product is several times faster than on the permuted view
        alpha = self.view.pattern[:, :, queries, :k_end].permute(0, 3, 2, 1).contiguous()
        vt = self.projected_values[:, :k_end]
        mixed = self.mixed[:, queries]
        if minus_mixed and self.scale is None:
            t = alpha.new_empty(*alpha.shape[:3], vt.shape[-1])
            for b in range(alpha.shape[0]):  # −x̃_i + Σ_h α_ij^h ṽ_j^h in one pass, x̃_i broadcast over the keys
                torch.baddbmm(mixed[b], alpha[b], vt[b], beta=-1, out=t[b])
        else:
            t = alpha @ vt
            if self.scale is not None:
                t.mul_(self.scale[:, None, queries])
            if minus_mixed:
                t.sub_(mixed[:, None])
        rows = torch.arange(queries.stop - queries.start, device=t.device)
        t[:, rows + queries.start, rows] += self.own[:, queries]
        return t


def residual_decomposition(
    model, cache, layer: int, *, dtype: torch.dtype = torch.float32, attention_mask=None
) -> Float[Tensor, "batch query source d_model"]:
    """The terms t_ij of x̃_i = Σ_j t_ij for every (query, source) of one layer, materialised
    (docs/method.md §10; ``[batch, query, source, d_model]``, for inspection and tests on short
    inputs: :func:`contribution_flow` never builds it whole).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=flow_names_filter(model))
    >>> t = residual_decomposition(model, cache, 0)
    >>> tuple(t.shape)
    (2, 20, 20, 32)
    """
    return (
        LayerResidual(model, cache, layer, dtype=check_dtype(dtype), attention_mask=attention_mask)
        .terms()
        .transpose(1, 2)
    )


def _normalise_rows(rows: Tensor, queries: slice, real: Tensor) -> Tensor:
    """Rows divided by their sums; a real row with nothing left (sum 0) becomes the identity row
    (the token keeps itself), a padded query's row is 0."""
    total = rows.sum(-1)
    empty = total <= 0
    if bool(empty.any()):
        r = torch.arange(rows.shape[1], device=rows.device)
        diag = rows[:, r, r + queries.start]
        rows[:, r, r + queries.start] = torch.where(empty, torch.ones_like(diag), diag)
        total = torch.where(empty, torch.ones_like(total), total)
    rows.div_(total[..., None])
    return rows.mul_(real[:, queries, None])


class _Mixer:
    """The rows of M^(l) for one layer and one method, one block of queries at a time."""

    def __init__(self, model, cache, layer: int, method: str, dtype, attention_mask, tokens):
        self.method = method
        if method in ("contribution", "alti"):
            self.res = LayerResidual(model, cache, layer, dtype=dtype, attention_mask=attention_mask)
            self.view = self.res.view
        else:
            self.view = get_attention_layer(model, cache, layer, dtype=dtype, attention_mask=attention_mask)
        b, _, n, _ = self.view.pattern.shape
        self.real = (
            self.view.query_mask
            if self.view.query_mask is not None
            else torch.ones(b, n, dtype=torch.bool, device=self.view.pattern.device)
        )
        if method == "contribution":
            res = self.res
            sq = (res.mixed * res.mixed).sum(-1)
            inv = torch.where(sq > 0, 1.0 / torch.where(sq > 0, sq, torch.ones_like(sq)), torch.zeros_like(sq))
            y = res._scaled(res.mixed) * inv[..., None]  # D_i x̃_i / ‖x̃_i‖²
            W_O = self.view.W_O
            h, d = W_O.shape[:2]
            self.u = (y @ W_O.reshape(h * d, -1).T).view(b, n, h, d).transpose(1, 2)  # [batch, head, query, d_head]
            self.v = self.view.v.transpose(1, 2)  # [batch, head, key, d_head]
            self.own_share = (res.mixed * res.own).sum(-1) * inv  # ⟨x̃_i, x_i + D_i b_O⟩ / ‖x̃_i‖²
        elif method == "alti":
            self.l1 = self.res.mixed.abs().sum(-1)
        elif method == "value_zeroing_rollout":
            self.vz = _value_zeroing_layer(model, tokens, self.view.layer, attention_mask).to(
                device=self.view.pattern.device, dtype=dtype
            )
        # [batch, head, chunk, key]-sized temporaries of one block (ALTI: d_model / head of them)
        d_model = self.view.W_O.shape[-1]
        self.temporaries = {"alti": -(-d_model // self.view.n_heads) + 2, "contribution": 2}.get(method, 1)

    def rows(self, queries: slice, k_end: int) -> Float[Tensor, "batch chunk key"]:
        """Normalised rows M^(l)[:, queries, :k_end] (keys from k_end on have no share)."""
        s, c = queries.start, queries.stop - queries.start
        r = torch.arange(c, device=self.view.pattern.device)
        alpha = self.view.pattern[:, :, queries, :k_end]
        if self.method == "contribution":
            dots = self.u[:, :, queries] @ self.v[:, :, :k_end].transpose(-1, -2)  # [batch, head, chunk, key]
            rows = dots.mul_(alpha).sum(1)
            rows[:, r, r + s] += self.own_share[:, queries]
            rows.clamp_min_(0)  # negative shares: clipped (docs/method.md §10)
        elif self.method == "alti":
            t = self.res.terms(queries, k_end, minus_mixed=True)  # t_ij − x̃_i, [batch, key, chunk, d_model]
            dist = torch.linalg.vector_norm(t, ord=1, dim=-1).transpose(1, 2)  # ‖t_ij − x̃_i‖₁
            rows = (self.l1[:, queries, None] - dist).clamp_min_(0)
            # a source with no attention term has t_ij = 0, proximity exactly 0 (not a rounding residue)
            reached = (alpha != 0).any(1)
            reached[:, r, r + s] = True
            rows.mul_(reached)
        elif self.method == "attention_rollout":
            rows = 0.5 * alpha.mean(1)
            rows[:, r, r + s] += 0.5
        else:
            rows = self.vz[:, queries, :k_end].clone()
        return _normalise_rows(rows, queries, self.real)


def _value_zeroing_layer(model, tokens, layer: int, attention_mask) -> Float[Tensor, "batch query key"]:
    """Value Zeroing scores of one layer (:func:`geolens.value_zeroing`, raw), each row of a
    padded batch computed on its real tokens alone."""
    from geolens.interventions.value_zeroing import value_zeroing

    if attention_mask is None:
        return value_zeroing(model, tokens, [layer])[0]
    out = torch.zeros(tokens.shape[0], tokens.shape[1], tokens.shape[1])
    for b, row in enumerate(attention_mask):
        idx = row.nonzero().flatten()
        real = slice(int(idx[0]), int(idx[-1]) + 1)
        if int(idx.numel()) != real.stop - real.start:
            raise ValueError(
                f"attention_mask row {b} has padding between real tokens: value_zeroing_rollout needs one run of real tokens per row"
            )
        out[b, real, real] = value_zeroing(model, tokens[b : b + 1, real], [layer])[0, 0]
    return out


def _chunk(view: AttentionLayer, mixer: _Mixer, query_chunk_size, memory_budget_bytes) -> int:
    n = view.pattern.shape[2]
    if query_chunk_size is None and memory_budget_bytes is None:
        query_chunk_size = CAUSAL_BLOCK_ROWS
    return split_query_chunk(view, query_chunk_size, memory_budget_bytes, n_temporaries=mixer.temporaries) or n


def _check(model, cache, method, target_layer, attention_mask, tokens, dtype):
    method = check_flow_method(method)
    n_layers = model.cfg.n_layers
    last = n_layers - 1 if target_layer is None else check_layer(target_layer, n_layers, name="target_layer")
    dtype = check_dtype(dtype)
    if tokens is not None:
        tokens = check_tokens(model, tokens)
    if method == "value_zeroing_rollout":
        if tokens is None:
            raise ValueError(
                "method='value_zeroing_rollout' reruns the model: pass tokens= (the tokens the cache was run on)"
            )
        pattern = cache_entry(cache, adapter_for(model).pattern_hook(0))
        if tuple(tokens.shape) != (pattern.shape[0], pattern.shape[-1]):
            raise ValueError(
                f"tokens has shape {tuple(tokens.shape)}, the cache holds [batch, pos] = {(pattern.shape[0], pattern.shape[-1])}"
            )
    check_cache_layers(model, cache)  # a cache stamped with another model's weights is refused
    if attention_mask is not None:
        pattern = cache_entry(cache, adapter_for(model).pattern_hook(0))
        attention_mask = check_attention_mask(attention_mask, pattern.shape[0], pattern.shape[-1]).to(pattern.device)
    elif tokens is not None:
        refuse_unmasked_padding(model, tokens)
    return method, last, dtype, attention_mask


def layer_mixing(
    model,
    cache,
    layer: int,
    method: FlowMethod = "contribution",
    *,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    tokens: Int[Tensor, "batch pos"] | None = None,
    dtype: torch.dtype = torch.float32,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
) -> Float[Tensor, "batch query source"]:
    """The mixing matrix M^(l) of one layer (docs/method.md §10): rows of real queries sum to 1,
    padded queries and sources are 0. Arguments as in :func:`contribution_flow`.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=flow_names_filter(model))
    >>> M = layer_mixing(model, cache, 0, "alti")
    >>> tuple(M.shape), round(float(M[0, 7].sum()), 4)
    ((2, 20, 20), 1.0)
    """
    method, _, dtype, attention_mask = _check(model, cache, method, None, attention_mask, tokens, dtype)
    layer = check_layer(layer, model.cfg.n_layers)
    mixer = _Mixer(model, cache, layer, method, dtype, attention_mask, tokens)
    view = mixer.view
    b, _, n, _ = view.pattern.shape
    out = view.pattern.new_zeros(b, n, n)
    for queries in query_slices(0, n, _chunk(view, mixer, query_chunk_size, memory_budget_bytes)):
        k_end = queries.stop if view.causal else n
        out[:, queries, :k_end] = mixer.rows(queries, k_end)
    return out


def contribution_flow(
    model,
    cache,
    method: FlowMethod = "contribution",
    *,
    target_layer: int | None = None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    tokens: Int[Tensor, "batch pos"] | None = None,
    dtype: torch.dtype = torch.float32,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
) -> Float[Tensor, "batch query source"]:
    """Input attributions of layer ``target_layer``'s output at each position (docs/method.md §10).

    R^(l) = M^(l) R^(l−1) with R^(0) = I, over the layers 0 … ``target_layer`` (default: the
    last), M^(l) the layer's mixing matrix by ``method`` (module docstring). Returns R
    ``[batch, query, source]``: R_ij is the share of source token j in the representation of
    position i; each real query's row sums to 1 and, in a causal model, R_ij = 0 for j > i.

    Args:
        model: the TransformerLens model the cache comes from.
        cache: as in :func:`geolens.contribution_weights`; it also needs the residual entering
            each block and the attention update (:func:`flow_names_filter`).
        method: ``"contribution"`` (default), ``"alti"``, ``"attention_rollout"`` or
            ``"value_zeroing_rollout"`` (reruns the model on ``tokens``: costly).
        target_layer: the layer whose output is attributed (negative counts from the end).
        attention_mask: ``[batch, pos]``, 1 = real token, the mask the cache was run with; padded
            queries get rows of 0 and padded sources no share, and real positions equal each
            prompt run alone.
        tokens: the tokens the cache was run on (only for ``"value_zeroing_rollout"``).
        dtype: compute dtype (float32 by default; float64 on request).
        query_chunk_size: queries per block of temporaries (default 64); results equal the
            unchunked ones up to float rounding.
        memory_budget_bytes: bound the per-block temporaries instead of a fixed block size.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.flow.flow_names_filter(model))
    >>> R = geolens.contribution_flow(model, cache, "contribution")
    >>> tuple(R.shape), round(float(R[1, 9].sum()), 4), float(R[1, 9, 10:].abs().sum())
    ((2, 20, 20), 1.0, 0.0)
    """
    method, last, dtype, attention_mask = _check(model, cache, method, target_layer, attention_mask, tokens, dtype)
    R = None
    for layer in range(last + 1):
        mixer = _Mixer(model, cache, layer, method, dtype, attention_mask, tokens)
        view = mixer.view
        b, _, n, _ = view.pattern.shape
        if R is None:
            R = torch.diag_embed(mixer.real.to(view.pattern.dtype))  # R^(0) = I on the real positions
        blocks = list(query_slices(0, n, _chunk(view, mixer, query_chunk_size, memory_budget_bytes)))
        if view.causal:
            # in place, last block first: block [s, e) reads rows < e of R, still the previous layer's
            for queries in reversed(blocks):
                e = queries.stop
                R[:, queries, :e] = mixer.rows(queries, e) @ R[:, :e, :e]
        else:
            M = view.pattern.new_zeros(b, n, n)
            for queries in blocks:
                M[:, queries] = mixer.rows(queries, n)
            R = M @ R
        del mixer
        if not bool(torch.isfinite(R).all()):  # where the NaN or inf first appears, and why
            check_finite(
                R,
                what=f"the shares of contribution_flow({method!r})",
                dims=("batch", "query", "source"),
                model=model,
                layer=layer,
            )
    return R
