"""Contribution weights and the attention baselines (docs/method.md §1–2; Cunningham & Muça Cirone 2026, §2.1–2.2).

For layer l, head h, query i and source j, with projected value ṽ_j^h = v_j^h W_O^h and head
output o_i^h = Σ_j α_ij^h ṽ_j^h:

    c_ij = ⟨o_i, α_ij ṽ_j⟩ / ‖o_i‖² = α_ij · (‖ṽ_j‖ / ‖o_i‖) · cos(o_i, ṽ_j)

- ``mode="intra"``: o_i is the head's own output o_i^h; Σ_j c_ij^h = 1 for each (h, i).
- ``mode="inter"``: o_i is the layer output Σ_h o_i^h (``attn.hook_out`` − b_O); Σ_h Σ_j c_ij^h = 1
  for each i, and the per-source totals are C_ij = Σ_h c_ij^h.

Efficient form (docs/method.md §2): ``[head, query, key, d_model]`` is never built. With
u_i^h = o_i W_O^{hT} the inner product is ⟨o_i, ṽ_j^h⟩ = ⟨u_i^h, v_j^h⟩, and with the Gram matrix
G^h = W_O^h W_O^{hT} the norm is ‖ṽ_j^h‖² = v_j^h G^h v_j^{hT}. Cost is O(head·query·key·d_head)
time and O(head·query·key) memory, the order of the attention pattern itself. G, the norms it
gives and query chunking live in :mod:`geolens.geometry` (``projected_value_norms``,
``head_outputs``, ``layer_output``, ``iter_query_chunks``, ``query_chunk_for_budget``);
:func:`layer_metrics` returns every per-layer quantity as one :class:`LayerMetrics`.

A zero-norm output o_i (a head whose value vectors cancel, or all-zero values) has no direction:
its row of contribution weights, relative norms and alignments is defined as 0 and a
:class:`ZeroNormOutputWarning` says how many rows were affected. Nothing here returns NaN.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import AttentionLayer, cache_lookup, get_attention_layer, required_hook_names
from geolens.geometry import (
    CONTRIBUTION_TEMPORARIES,
    METRIC_TEMPORARIES,
    fill_query_chunks,
    gram,
    iter_query_chunks,
    projected_value_norms,
    split_query_chunk,
)
from geolens.validation import check_choice, check_eps, check_layer, check_out

Mode = Literal["intra", "inter"]


class ZeroNormOutputWarning(UserWarning):
    """Some attention outputs had zero norm; their rows were set to 0 instead of NaN."""


def _check_mode(mode: str) -> None:
    if mode == "both":
        raise ValueError("mode='both' is contribution_weight_pair(...): one call, one return type")
    check_choice(mode, ("intra", "inter"), name="mode")


class ContributionPair(NamedTuple):
    """Intra- and inter-head contribution weights of one pass (:func:`contribution_weight_pair`)."""

    intra: Float[Tensor, "*layer batch head query key"]
    inter: Float[Tensor, "*layer batch head query key"]


@dataclass
class _Geometry:
    """Shared intermediate quantities for one layer and one mode.

    The inverse norms are 0 where the norm is 0, so every ratio built from them is defined and
    zero there (never NaN); the big ``[batch, head, query, key]`` tensors are only multiplied by
    broadcast small ones.
    """

    dot: Float[Tensor, "batch head query key"]  # ⟨o_i, ṽ_j^h⟩
    value_norm: Float[Tensor, "batch head key"]  # ‖ṽ_j^h‖
    inv_out_norm: Float[Tensor, "batch head query"]  # 1/‖o_i‖ (head or layer output), 0 if ‖o_i‖ ≤ eps
    inv_value_norm: Float[Tensor, "batch head key"]  # 1/‖ṽ_j^h‖, 0 if ‖ṽ_j^h‖ = 0


def _inverse(x: Tensor, zero: Tensor) -> Tensor:
    return torch.where(zero, torch.zeros_like(x), 1.0 / torch.where(zero, torch.ones_like(x), x))


def _projection(z: Float[Tensor, "batch query head d_head"], W_O: Tensor, mode: Mode) -> tuple[Tensor, Tensor]:
    """(u [batch, query, head, d_head], ‖o_i‖² [batch, head, query]) with ⟨o_i, ṽ_j^h⟩ = ⟨u_i^h, v_j^h⟩,
    for any rows z of a layer (each query row is its own computation)."""
    if mode == "intra":
        # u_i^h = o_i^h W_O^{hT} = z_i^h G^h, as one batched product over heads
        by_head = z.transpose(1, 2)  # [batch, head, query, d_head]
        u = by_head @ gram(W_O)
        return u.transpose(1, 2), (u * by_head).sum(-1)
    # u_i^h = o_i W_O^{hT} = Σ_h' z_i^h' G^{h'h}: one product with the cross-head Gram, o_i never built
    flat = z.reshape(*z.shape[:2], -1)
    u = flat @ gram(W_O, cross_heads=True)
    out_sq = (u * flat).sum(-1)  # z G z^T = ‖o_i‖²
    return u.reshape(z.shape), out_sq[:, None, :].expand(-1, z.shape[2], -1)


def _geometry(layer: AttentionLayer, mode: Mode, eps: float) -> _Geometry:
    _check_mode(mode)
    u, out_sq = _projection(layer.z, layer.W_O, mode)
    dot = torch.einsum("bqhd,bkhd->bhqk", u, layer.v)
    return _finish_geometry(layer, mode, eps, dot, projected_value_norms(layer), out_sq)


def _norm_and_zero_rows(layer: AttentionLayer, mode: Mode, out_sq: Tensor, eps: float) -> tuple[Tensor, Tensor, int]:
    """(‖o_i‖, rows with ‖o_i‖ ≤ eps, how many real outputs that is) from ``[batch, head, query]``
    ‖o_i‖²; padded queries (α = 0 by construction) are zero rows by design and not counted, and
    an inter-head output (repeated over heads) counts once."""
    out_norm = out_sq.clamp_min(0).sqrt()
    zero_rows = out_norm <= eps
    real = zero_rows if layer.query_mask is None else zero_rows & layer.query_mask[:, None, :]
    n = int(real.sum()) if bool(real.any()) else 0
    return out_norm, zero_rows, n if mode == "intra" else n // layer.n_heads


def _warn_zero_rows(layer: AttentionLayer, mode: Mode, eps: float, n: int, stacklevel: int) -> None:
    if n:
        what = "(batch, head, query) head outputs" if mode == "intra" else "(batch, query) layer outputs"
        warnings.warn(
            f"layer {layer.layer}: {n} {what} have zero norm (≤ {eps:g}); their contribution "
            "weights, relative norms and alignments are set to 0",
            ZeroNormOutputWarning,
            stacklevel=stacklevel + 1,
        )


def _out_norm(layer: AttentionLayer, mode: Mode, eps: float, out_sq: Tensor, stacklevel: int) -> tuple[Tensor, Tensor]:
    """(‖o_i‖, zero rows) from ‖o_i‖², warning once about real (unpadded) outputs of norm ≤ eps."""
    out_norm, zero_rows, n = _norm_and_zero_rows(layer, mode, out_sq, eps)
    _warn_zero_rows(layer, mode, eps, n, stacklevel + 1)
    return out_norm, zero_rows


def _finish_geometry(
    layer: AttentionLayer, mode: Mode, eps: float, dot: Tensor, value_norm: Tensor, out_sq: Tensor
) -> _Geometry:
    out_norm, zero_rows = _out_norm(layer, mode, eps, out_sq, stacklevel=4)
    return _Geometry(
        dot=dot,
        value_norm=value_norm,
        inv_out_norm=_inverse(out_norm, zero_rows),
        inv_value_norm=_inverse(value_norm, value_norm == 0),
    )


def _contributions(
    layer: AttentionLayer, modes: tuple[Mode, ...], eps: float, out: Tensor | None = None
) -> Float[Tensor, "mode batch head query key"]:
    """c_ij = α_ij ⟨u_i / ‖o_i‖², v_j⟩ for each mode in one pass over α.

    z comes from the forward when the cache has it (:attr:`~geolens.adapter.AttentionLayer.z_hint`),
    used at once and checked during the pass: ``z_probes @ α^T`` is filled block by block while
    each block of α is in cache and compared with z r (:meth:`~geolens.adapter.AttentionLayer.z_matches`,
    Freivalds' check); if it fails, the layer is redone with z = α v, overwriting the output.
    Without a usable ``hook_z``, z is α v (:attr:`~geolens.adapter.AttentionLayer.z`).

    Each mode's u (:func:`_projection`, one large product per mode) is scaled by 1/‖o_i‖² before
    the big product; then one batched product per query block
    (:meth:`~geolens.adapter.AttentionLayer.query_blocks`) covers every mode (the mode axis rides
    along the query rows), reads only the keys the block can see and is multiplied by α while it
    is still in cache, straight into the output (``out`` when given, e.g. a slice of an
    all-layer result). Keys after a causal block are 0 (α = 0 there). The only big temporary is
    one block's product.
    """
    hinted = "z" not in layer.__dict__ and layer.z_hint is not None and layer.z_fits(layer.z_hint)
    if hinted:
        out, n_zero, probed = _contribution_pass(layer, modes, eps, out, layer.z_hint, check=True)
        if layer.z_matches(layer.z_hint, probed):
            layer.__dict__["z"] = layer.z_hint  # checked: later reads of layer.z skip the check
        else:
            layer.z_hint = None
            hinted = False
    if not hinted:
        out, n_zero, _ = _contribution_pass(layer, modes, eps, out, layer.z, check=False)
    for mode, n in zip(modes, n_zero):
        _warn_zero_rows(layer, mode, eps, n, stacklevel=4)
    return out


def _contribution_pass(
    layer: AttentionLayer, modes: tuple[Mode, ...], eps: float, out: Tensor | None, z: Tensor, check: bool
) -> tuple[Tensor, list[int], Tensor | None]:
    """The pass of :func:`_contributions` with a given z: (output, real zero-norm rows per mode,
    ``z_probes @ α^T`` when ``check``)."""
    pattern = layer.pattern
    b, h, n_q, n_k = pattern.shape
    d, n_m = layer.v.shape[-1], len(modes)
    u = pattern.new_empty(b, h, n_q, n_m, d)
    n_zero = []
    for m, mode in enumerate(modes):
        u_m, out_sq = _projection(z, layer.W_O, mode)
        out_norm, zero_rows, n = _norm_and_zero_rows(layer, mode, out_sq, eps)
        n_zero.append(n)
        torch.mul(u_m.transpose(1, 2), (_inverse(out_norm, zero_rows) ** 2)[..., None], out=u[:, :, :, m])
    blocks = layer.query_blocks()
    rows = max(q.stop - q.start for q, _ in blocks)
    vk = layer.v.transpose(1, 2).contiguous().view(b * h, n_k, d)  # [batch·head, key, d_head]
    out = pattern.new_empty(n_m, b, h, n_q, n_k) if out is None else out
    buffer = pattern.new_empty(b * h * rows * n_m * max(k for _, k in blocks))
    probed = pattern.new_empty(b, h, 2, n_q) if check else None
    for queries, k_end in blocks:
        n = queries.stop - queries.start
        block = buffer[: b * h * n * n_m * k_end].view(b * h, n * n_m, k_end)
        torch.bmm(u[:, :, queries].reshape(b * h, n * n_m, d), vk[:, :k_end].transpose(1, 2), out=block)
        block = block.view(b, h, n, n_m, k_end)
        alpha = pattern[:, :, queries, :k_end]
        for m in range(n_m):
            torch.mul(block[:, :, :, m], alpha, out=out[m, :, :, queries, :k_end])
        if k_end < n_k:
            out[:, :, :, queries, k_end:].zero_()
        if check:
            probed[:, :, :, queries] = layer.z_probes[..., :k_end] @ alpha.transpose(-1, -2)
    return out, n_zero, probed


class LayerMetrics(NamedTuple):
    """Everything the efficient form gives for one layer and one mode (:func:`layer_metrics`).

    ``relative_norm · alignment · attention = contribution``; ``value_norm`` broadcasts over the
    query axis (``attention · value_norm`` is the value-weighted baseline, docs/method.md §2). A
    NamedTuple: it unpacks as ``(α, rel, cos, c, ‖ṽ‖)``.
    """

    attention: Float[Tensor, "batch head query key"]  # α_ij (the pattern itself)
    relative_norm: Float[Tensor, "batch head query key"]  # ‖ṽ_j‖ / ‖o_i‖ (0 where ‖o_i‖ ≤ eps)
    alignment: Float[Tensor, "batch head query key"]  # cos(o_i, ṽ_j) (0 where either norm is 0)
    contribution: Float[Tensor, "batch head query key"]  # c_ij = α_ij ⟨o_i, ṽ_j⟩ / ‖o_i‖²
    value_norm: Float[Tensor, "batch head 1 key"]  # ‖ṽ_j‖


def layer_metrics(
    layer: AttentionLayer,
    mode: Mode = "intra",
    *,
    eps: float = 0.0,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
) -> LayerMetrics:
    """α, ‖ṽ_j‖/‖o_i‖, cos(o_i, ṽ_j), c_ij and ‖ṽ_j‖ of one :class:`AttentionLayer` (docs/method.md §1–2).

    ``mode`` picks o_i: the head output (``"intra"``) or the layer output (``"inter"``); outputs
    with ‖o_i‖ ≤ ``eps`` give rows of 0 (:class:`ZeroNormOutputWarning`). ``query_chunk_size`` or
    ``memory_budget_bytes`` (:func:`geolens.geometry.query_chunk_for_budget`) bound the temporaries to
    ``[batch, head, chunk, key]``; each chunk is written into preallocated outputs, and the results
    equal the unchunked ones up to float rounding.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> m = layer_metrics(geolens.get_attention_layer(model, cache, 0), "inter")
    >>> tuple(m.contribution.shape), round(float(m.contribution[0, :, 5].sum()), 4)
    ((2, 4, 20, 20), 1.0)
    """
    eps = check_eps(eps)
    chunk = split_query_chunk(layer, query_chunk_size, memory_budget_bytes, n_temporaries=METRIC_TEMPORARIES)
    if chunk is not None:

        def part(sub: AttentionLayer) -> tuple[Tensor, ...]:
            return layer_metrics(sub, mode, eps=eps)[1:4]

        relative, cos, contribution = fill_query_chunks(layer, chunk, part, 3)
        return LayerMetrics(layer.pattern, relative, cos, contribution, projected_value_norms(layer)[:, :, None, :])
    g = _geometry(layer, mode, eps)
    alpha = layer.pattern
    inv_out = g.inv_out_norm[..., None]
    relative = g.value_norm[:, :, None, :] * inv_out
    cos = g.dot * inv_out * g.inv_value_norm[:, :, None, :]
    contribution = alpha * g.dot * (inv_out * inv_out)
    return LayerMetrics(alpha, relative, cos, contribution, g.value_norm[:, :, None, :])


@dataclass(frozen=True)
class ReadOptions:
    """The keyword arguments that :func:`contribution_weights`, :func:`attention_metrics` and
    :func:`influence_factors` share (documented in :func:`contribution_weights`): how a layer is
    read from the cache and computed. Each public function declares them in its own signature
    (for help() and editors) and hands them over as one of these; ``tests/test_contributions.py``
    checks that the three signatures declare them alike."""

    dtype: torch.dtype = torch.float32
    eps: float = 0.0
    query_chunk_size: int | None = None
    memory_budget_bytes: int | None = None
    attention_mask: Tensor | None = None

    def read(self, model, cache, layer: int) -> AttentionLayer:
        """The :class:`AttentionLayer` of ``layer``, in ``dtype``, padding zeroed."""
        return get_attention_layer(model, cache, layer, dtype=self.dtype, attention_mask=self.attention_mask)

    def metrics(self, model, cache, layer: int, mode: Mode) -> tuple[int, LayerMetrics]:
        """(layer index, :func:`layer_metrics`) of one layer: the body of :func:`influence_factors`
        and :func:`attention_metrics`."""
        _check_mode(mode)
        [l] = _layers(model, layer)
        view = self.read(model, cache, l)
        return l, layer_metrics(
            view,
            mode,
            eps=self.eps,
            query_chunk_size=self.query_chunk_size,
            memory_budget_bytes=self.memory_budget_bytes,
        )


def _layer_contributions(
    layer: AttentionLayer,
    modes: tuple[Mode, ...],
    eps: float,
    query_chunk_size: int | None,
    memory_budget_bytes: int | None,
    out: Tensor | None = None,
) -> Float[Tensor, "mode batch head query key"]:
    """:func:`_contributions` of every mode, over query chunks when asked, written into ``out``."""
    chunk = split_query_chunk(
        layer, query_chunk_size, memory_budget_bytes, n_temporaries=CONTRIBUTION_TEMPORARIES * len(modes)
    )
    if chunk is None:
        return _contributions(layer, modes, eps, out)
    if out is None:
        out = layer.pattern.new_empty(len(modes), *layer.pattern.shape)
    for queries, sub in iter_query_chunks(layer, query_chunk_size=chunk):
        _contributions(sub, modes, eps, out[:, :, :, queries])
    return out


def _mode_out(
    out: Tensor, modes: tuple[Mode, ...], shape: tuple[int, ...], dtype, device, inputs, dtype_from: str
) -> Tensor:
    """A caller's ``out`` (``shape``, with a leading axis of 2 for both modes), checked
    (:func:`~geolens.validation.check_out`), as the internal ``[mode, …]`` view."""
    full = (len(modes), *shape) if len(modes) > 1 else shape
    out = check_out(out, full, dtype, device, inputs=inputs, dtype_from=dtype_from)
    return out if len(modes) > 1 else out.unsqueeze(0)


def _from_layer(layer: AttentionLayer, modes, eps, query_chunk_size, memory_budget_bytes, out) -> Tensor:
    eps = check_eps(eps)
    if out is not None:
        inputs = (layer.pattern, layer.v, layer.z_hint)
        out = _mode_out(
            out,
            modes,
            tuple(layer.pattern.shape),
            layer.pattern.dtype,
            layer.pattern.device,
            inputs,
            "the layer's dtype",
        )
    return _layer_contributions(layer, modes, eps, query_chunk_size, memory_budget_bytes, out)


def contribution_weights_from_layer(
    layer: AttentionLayer,
    mode: Mode = "intra",
    *,
    eps: float = 0.0,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    out: Tensor | None = None,
) -> Float[Tensor, "batch head query key"]:
    """c_ij for one :class:`AttentionLayer` (docs/method.md §2, efficient form), optionally query-chunked.

    Chunks are written straight into the output, so the extra memory beyond it is one chunk's
    temporaries; ``memory_budget_bytes`` picks the chunk (:func:`geolens.geometry.query_chunk_for_budget`).
    ``out``: as in :func:`contribution_weights`. Both modes in one pass:
    :func:`contribution_weight_pair_from_layer`.
    """
    _check_mode(mode)
    return _from_layer(layer, (mode,), eps, query_chunk_size, memory_budget_bytes, out)[0]


def contribution_weight_pair_from_layer(
    layer: AttentionLayer,
    *,
    eps: float = 0.0,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    out: Tensor | None = None,
) -> ContributionPair:
    """Intra- and inter-head c_ij of one :class:`AttentionLayer` in one pass, as a
    :class:`ContributionPair` (its two tensors are views of one ``[2, batch, head, query, key]``
    allocation; ``out`` has that shape; ``memory_budget_bytes`` counts twice the temporaries of
    one mode)."""
    return ContributionPair(*_from_layer(layer, ("intra", "inter"), eps, query_chunk_size, memory_budget_bytes, out))


def _layers(model, layer: int | None) -> list[int]:
    from geolens.adapter import adapter_for

    n_layers = adapter_for(model).cfg.n_layers  # a transformers model read as it is has no model.cfg
    if layer is None:
        return list(range(n_layers))
    return [check_layer(layer, n_layers)]


def _contribution_weights(
    model, cache, layer, modes, dtype, eps, query_chunk_size, memory_budget_bytes, attention_mask, out
):
    """``[mode, (layer,) batch, head, query, key]``: the shared body of :func:`contribution_weights`
    and :func:`contribution_weight_pair`."""
    options = ReadOptions(dtype, check_eps(eps), query_chunk_size, memory_budget_bytes, attention_mask)
    layers = _layers(model, layer)
    given, out = out, None  # out: [mode, (layer,) batch, head, query, key], each layer written in place
    for i, l in enumerate(layers):
        view = options.read(model, cache, l)
        if i == 0:
            shape = tuple(view.pattern.shape) if layer is not None else (len(layers), *view.pattern.shape)
            if given is not None:
                # before the first write: no pattern, v or z entry of the cache (any layer) may be
                # overwritten, whether this call reads it or the caller keeps it
                inputs = [cache_lookup(cache, name) for name in required_hook_names(model)]
                out = _mode_out(given, modes, shape, dtype, view.pattern.device, inputs, "the dtype argument")
            elif layer is None:
                out = view.pattern.new_empty(len(modes), *shape)
        target = None if out is None else out[:, i] if layer is None else out
        result = _layer_contributions(
            view, modes, options.eps, options.query_chunk_size, options.memory_budget_bytes, target
        )
    if out is None:
        out = result
    return out


def contribution_weights(
    model,
    cache,
    layer: int | None = None,
    mode: Mode = "intra",
    *,
    dtype: torch.dtype = torch.float32,
    eps: float = 0.0,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    attention_mask: Tensor | None = None,
    out: Tensor | None = None,
    head: int | None = None,
) -> Float[Tensor, "*layer batch head query key"]:
    """Contribution weights c_ij (docs/method.md §2) from a TransformerLens ``ActivationCache``.

    Args:
        model: a ``TransformerBridge`` (TL 4.x) or ``HookedTransformer`` (TL 2.x/3.x).
        cache: from ``model.run_with_cache(tokens, names_filter=geolens.names_filter(model))``.
        layer: one layer index, or ``None`` for all layers (a leading ``layer`` axis is added).
        mode: ``"intra"`` (Σ_j c = 1 per head and query) or ``"inter"`` (Σ_h Σ_j c = 1 per
            query). Both in one pass that shares the value norms, the Gram products and the
            pattern read: :func:`contribution_weight_pair`.
        dtype: compute dtype (float32 by default even for bf16/fp16 models; float64 on request).
        eps: outputs with ‖o_i‖ ≤ eps count as zero-norm (rows set to 0, with a warning).
        query_chunk_size: compute over chunks of this many query positions (bounded memory for
            long sequences; identical results).
        memory_budget_bytes: instead of ``query_chunk_size``, the most bytes the temporaries
            may take beyond the inputs and the output; the chunk size is derived from it
            (:func:`geolens.geometry.query_chunk_for_budget`).
        attention_mask: ``[batch, pos]``, 1 = real token (TransformerLens' convention), the mask the
            cache was run with. Padded queries and keys get 0; real positions equal each prompt
            run alone. Without it a batch that looks padded is refused.
        out: a tensor to write the result into, as ``out=`` in torch: exactly the result's shape,
            in ``dtype``, on the cache's
            device, sharing no memory with the cache's pattern, v or z of any layer; the result
            is a view of it. Reusing one ``out`` across calls (a loop over texts of one shape)
            saves mapping fresh memory for every result, which on a CPU costs about a third of
            the call at 512 tokens (``benchmarks/contributions.py``, column b0).
        head: one head (an index in ``[-n_heads, n_heads)``): its weights only, without the head
            axis. In ``"inter"`` mode they are still normalised by the whole layer's output, so
            they equal that head's slice of the full result.

    Returns:
        ``[batch, head, query, key]`` for one layer, ``[layer, batch, head, query, key]`` for all;
        without the ``head`` axis when ``head=`` is given.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> c = contribution_weights(model, cache, layer=0)
    >>> tuple(c.shape), round(float(c[0, 0, 5].sum()), 4)
    ((2, 4, 20, 20), 1.0)
    >>> bool(torch.equal(contribution_weights(model, cache, layer=0, head=2), c[:, 2]))
    True
    """
    _check_mode(mode)
    if head is not None:
        from geolens.adapter import adapter_for
        from geolens.validation import check_head

        head = check_head(head, adapter_for(model).n_heads)
        if out is not None:
            raise ValueError("out= holds every head's weights: leave head= out, or out= out")
    result = _contribution_weights(
        model, cache, layer, (mode,), dtype, eps, query_chunk_size, memory_budget_bytes, attention_mask, out
    )[0]
    return result if head is None else result[..., head, :, :]


def contribution_weight_pair(
    model,
    cache,
    layer: int | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    eps: float = 0.0,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    attention_mask: Tensor | None = None,
    out: Tensor | None = None,
) -> ContributionPair:
    """Intra- and inter-head contribution weights in one pass, as a :class:`ContributionPair`
    ``(intra, inter)``: the pass shares the value norms, the Gram products and the pattern read.
    Arguments as in :func:`contribution_weights`; ``out`` is ``[2, *shape]`` (intra then inter)
    and each tensor of the pair a view of it.

    >>> import geolens
    >>> from geolens.contributions import contribution_weight_pair
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> pair = contribution_weight_pair(model, cache, layer=0)
    >>> tuple(pair.inter.shape), round(float(pair.inter[0, :, 5].sum()), 4)
    ((2, 4, 20, 20), 1.0)
    """
    return ContributionPair(
        *_contribution_weights(
            model,
            cache,
            layer,
            ("intra", "inter"),
            dtype,
            eps,
            query_chunk_size,
            memory_budget_bytes,
            attention_mask,
            out,
        )
    )


def per_source_totals(
    inter_contributions: Float[Tensor, "*layer batch head query key"],
) -> Float[Tensor, "*layer batch query key"]:
    """C_ij = Σ_h c_ij^h for inter-head contribution weights (docs/method.md §2); Σ_j C_ij = 1.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> C = geolens.per_source_totals(geolens.contribution_weights(model, cache, layer=0, mode="inter"))
    >>> tuple(C.shape), round(float(C[1, 9].sum()), 4)  # [batch, query, key]; each query sums to 1
    ((2, 20, 20), 1.0)
    """
    return inter_contributions.sum(dim=-3)
