""":class:`AttentionLayer`, one attention layer's tensors in docs/method.md §0 layouts, and
:func:`get_attention_layer`, which reads it from a cache and checks it against the model.

- ``pattern`` α: ``[batch, head, query_pos, key_pos]`` (``blocks.{l}.attn.hook_pattern``)
- ``v``: ``[batch, key_pos, head, d_head]`` (``blocks.{l}.attn.hook_v``), grouped-query value
  heads expanded so that query head h reads kv head ``h // (n_heads // n_kv_heads)``
- ``W_O``: ``[head, d_head, d_model]`` and ``b_O``: ``[d_model]`` (zeros for bias-free models)

and z_i^h = Σ_j α_ij^h v_j^h (``hook_z``), so that Σ_h z^h W_O^h + b_O is the pre-norm attention
output.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from geolens.adapter.base import TLModel
from geolens.adapter.cache import _cache_get, cache_lookup
from geolens.adapter.registry import adapter_for
from geolens.layout import expand_kv_heads
from geolens.validation import check_attention_mask, check_cache_layers, check_dtype, check_layer

# query blocks of a causal layer (AttentionLayer.query_blocks): at least CAUSAL_BLOCKS, of at most
# CAUSAL_BLOCK_ROWS queries each (small enough that one block's [batch, head, rows, key] product
# stays in cache while α multiplies it)
CAUSAL_BLOCKS = 4
CAUSAL_BLOCK_ROWS = 64


@dataclass
class AttentionLayer:
    """One attention layer's tensors in docs/method.md §0 layouts, in one compute dtype."""

    layer: int
    pattern: Float[Tensor, "batch head query key"]
    v: Float[Tensor, "batch key head d_head"]  # kv heads expanded to query heads
    W_O: Float[Tensor, "head d_head d_model"]
    b_O: Float[Tensor, "d_model"]
    n_kv_heads: int
    model_mode: str
    # Real-token masks (True = real) of the query and key positions, or None for an unpadded batch.
    # Padded positions already hold α = 0 and v = 0, so every quantity is 0 there.
    query_mask: Bool[Tensor, "batch query"] | None = None
    key_mask: Bool[Tensor, "batch key"] | None = None
    # True when query i (at absolute position query_start + i) never sees a key after it (a causal
    # decoder): computations may then skip the keys after each block of queries. False (unknown)
    # for a layer built by hand, which is always safe.
    causal: bool = False
    query_start: int = 0
    # The forward's own z (``hook_z``, [batch, query, head, d_head]) when the cache has it in the
    # compute dtype: :attr:`z` returns it instead of recomputing α v once a random projection
    # agrees (:meth:`z_agrees`), else recomputes. None: always recompute.
    z_hint: Float[Tensor, "batch query head d_head"] | None = None

    @property
    def n_heads(self) -> int:
        return self.pattern.shape[1]

    def query_blocks(self) -> list[tuple[slice, int]]:
        """(query slice, number of keys it can see) per block of queries when the layer is known
        causal, else one block with every key. A causal layer gets max(:data:`CAUSAL_BLOCKS`,
        ⌈query / :data:`CAUSAL_BLOCK_ROWS`⌉) blocks (one below 16 queries); block b needs the keys
        up to its last query only, so a [query, key] product does (n + 1) / 2n of the full work
        with n blocks (10/16 with 4, 36/64 with 8 at 512 queries)."""
        n_q, n_k = self.pattern.shape[-2:]
        if not self.causal:
            return [(slice(0, n_q), n_k)]
        size = -(-n_q // max(CAUSAL_BLOCKS, -(-n_q // CAUSAL_BLOCK_ROWS))) if n_q >= 4 * CAUSAL_BLOCKS else n_q
        return [
            (slice(s, min(s + size, n_q)), min(n_k, self.query_start + min(s + size, n_q))) for s in range(0, n_q, size)
        ]

    @cached_property
    def z(self) -> Float[Tensor, "batch query head d_head"]:
        """z_i^h = Σ_j α_ij^h v_j^h, what ``hook_z`` holds: the cached ``hook_z`` (:attr:`z_hint`)
        when it passes :meth:`z_agrees`, else recomputed in the compute dtype (in a causal layer
        each block of queries reads only the keys it can see, where α ≠ 0)."""
        if self.z_hint is not None and self.z_agrees(self.z_hint):
            return self.z_hint
        blocks = self.query_blocks()
        if len(blocks) == 1 and blocks[0][1] == self.pattern.shape[-1]:
            return torch.einsum("bhqk,bkhd->bqhd", self.pattern, self.v)
        v = self.v.transpose(1, 2)  # [batch, head, key, d_head]
        out = v.new_empty(*self.pattern.shape[:3], v.shape[-1])
        for queries, k_end in blocks:
            torch.matmul(self.pattern[:, :, queries, :k_end], v[:, :, :k_end], out=out[:, :, queries])
        return out.transpose(1, 2)

    def z_agrees(self, z: Float[Tensor, "batch query head d_head"], *, rtol: float = 1e-4) -> bool:
        """Whether ``z`` equals α v (Freivalds' check): for a fixed random r ∈ R^{d_head}, every
        (batch, head, query) must have |z_i r − Σ_j α_ij (v_j r)| ≤ rtol · Σ_j α_ij |v_j r|.

        One read of the pattern against two key vectors instead of the [query, key, d_head]
        product; a z that differs from α v (another forward, a hook that edited z, a lower
        precision, a padding mask applied afterwards) fails it except with probability 0, and
        then z is recomputed.

        >>> import geolens, torch
        >>> from geolens.testing import tiny_bridge, tiny_tokens
        >>> model = tiny_bridge("gqa")
        >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
        >>> layer = geolens.get_attention_layer(model, cache, 0)
        >>> layer.z_agrees(cache["blocks.0.attn.hook_z"]), layer.z_agrees(cache["blocks.0.attn.hook_z"] * 1.001)
        (True, False)
        """
        if not self.z_fits(z):
            return False
        # (probes α^T)^T over every key: α is read once in its own layout (the 2-row side is the
        # small operand, which BLAS handles far better than α @ [key, 2])
        return self.z_matches(z, self.z_probes @ self.pattern.transpose(-1, -2), rtol=rtol)

    def z_fits(self, z: Tensor) -> bool:
        """Whether ``z`` has this layer's [batch, query, head, d_head] shape and compute dtype."""
        return z.shape == (self.pattern.shape[0], self.pattern.shape[2], *self.v.shape[2:]) and z.dtype == self.v.dtype

    @cached_property
    def z_probes(self) -> Float[Tensor, "batch head 2 key"]:
        """[v_j r, |v_j r|] for :meth:`z_agrees`, with r ∈ R^{d_head} drawn from a fixed seed
        (:meth:`z_matches` compares ``z_probes @ α^T`` with z r)."""
        return torch.stack([self._z_probe_keys, self._z_probe_keys.abs()], dim=-2)

    @cached_property
    def _z_probe(self) -> Tensor:
        generator = torch.Generator().manual_seed(0)
        return (
            torch.randn(self.v.shape[-1], generator=generator, dtype=torch.float64).to(self.v.dtype).to(self.v.device)
        )

    @cached_property
    def _z_probe_keys(self) -> Tensor:
        return (self.v @ self._z_probe).transpose(1, 2)

    def z_matches(self, z: Tensor, probed: Float[Tensor, "batch head 2 query"], *, rtol: float = 1e-4) -> bool:
        """The test of :meth:`z_agrees`, given ``probed = z_probes @ α^T`` (which a blocked
        computation can fill block by block while each block of α is in cache)."""
        zr = (z @ self._z_probe).transpose(1, 2)  # [batch, head, query]
        return bool(((zr - probed[:, :, 0]).abs() <= rtol * probed[:, :, 1] + torch.finfo(z.dtype).tiny).all())

    def query_slice(self, queries: slice) -> "AttentionLayer":
        """The same layer restricted to a contiguous range of query positions (for chunked computation)."""
        if queries.step not in (None, 1):
            raise ValueError(f"query_slice takes a contiguous range of queries, got step {queries.step}")
        return AttentionLayer(
            self.layer,
            self.pattern[:, :, queries],
            self.v,
            self.W_O,
            self.b_O,
            self.n_kv_heads,
            self.model_mode,
            None if self.query_mask is None else self.query_mask[:, queries],
            self.key_mask,
            self.causal,
            self.query_start + range(self.pattern.shape[2])[queries].start,
            None if self.z_hint is None else self.z_hint[:, queries],
        )


def get_attention_layer(
    model: TLModel,
    cache,
    layer: int,
    *,
    dtype: torch.dtype = torch.float32,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> AttentionLayer:
    """Read pattern, v, W_O and b_O of ``layer`` from ``cache`` and check them against the model.

    Values are cast to ``dtype`` (float32 by default, also for bf16/fp16 models). ``layer`` may
    be negative (``-1`` = last layer). The cached shapes must match the model (layers, heads,
    kv heads, d_head): a cache of another architecture is refused.

    ``attention_mask`` (``[batch, pos]``, 1 = real token, TransformerLens' convention) is the
    mask the cache was run with (``model.run_with_cache(tokens, attention_mask=mask)``): padded
    query rows and key columns are set to 0 (α and v), so every quantity is 0 there and the real
    positions equal each prompt run alone. Without it, a batch that looks padded is refused.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> layer = geolens.get_attention_layer(model, cache, layer=0)
    >>> tuple(layer.pattern.shape), tuple(layer.v.shape), tuple(layer.W_O.shape)  # kv heads expanded to 4
    ((2, 4, 20, 20), (2, 20, 4, 8), (4, 8, 32))
    """
    adapter = adapter_for(model)
    cfg = adapter.cfg
    layer = check_layer(layer, cfg.n_layers)
    dtype = check_dtype(dtype)
    check_cache_layers(model, cache, cfg.n_layers)
    pattern = _cache_get(cache, adapter.pattern_hook(layer))
    v = _cache_get(cache, adapter.value_hook(layer))
    if pattern.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"layer {layer}: expected hook_pattern [batch, head, query, key] and hook_v "
            f"[batch, key, kv_head, d_head], got {tuple(pattern.shape)} and {tuple(v.shape)}"
        )
    batch, n_heads, n_q, n_k = pattern.shape
    if n_heads != cfg.n_heads:
        raise ValueError(f"layer {layer}: hook_pattern has {n_heads} heads, the model has {cfg.n_heads}")
    if v.shape[0] != batch or v.shape[1] != n_k:
        raise ValueError(
            f"layer {layer}: hook_v {tuple(v.shape)} does not match hook_pattern {tuple(pattern.shape)} "
            "on batch and key positions"
        )
    n_kv = adapter.n_kv_heads
    if v.shape[2] != n_kv or v.shape[3] != cfg.d_head:
        raise ValueError(
            f"layer {layer}: hook_v has {v.shape[2]} kv heads of size {v.shape[3]}, the model has "
            f"{n_kv} kv heads of size {cfg.d_head}: the cache comes from another model"
        )
    device = pattern.device
    W_O, b_O = adapter.compute_output_weights(layer, dtype, device)
    if W_O.shape != (n_heads, v.shape[3], cfg.d_model):
        raise ValueError(
            f"layer {layer}: W_O has shape {tuple(W_O.shape)}, expected {(n_heads, v.shape[3], cfg.d_model)}"
        )
    device = pattern.device
    pattern = pattern.to(dtype)
    v = expand_kv_heads(v.to(dtype), n_heads)
    query_mask = key_mask = z_hint = None
    if attention_mask is None:
        check_unpadded(pattern, window=adapter.sliding_window(layer), layer=layer)
        z_hint = cache_lookup(cache, adapter.z_hook(layer))
        if z_hint is not None and (z_hint.dtype != dtype or z_hint.device != pattern.device):
            z_hint = None  # a bf16 z would carry the model's rounding: recompute in the compute dtype
    else:
        mask = check_attention_mask(attention_mask, batch, n_k).to(device)
        if n_q != n_k:
            raise ValueError(f"layer {layer}: attention_mask needs a square pattern, got {n_q} queries and {n_k} keys")
        query_mask = key_mask = mask
        leaked = pattern * (mask[:, None, :, None] & ~mask[:, None, None, :])
        if bool((leaked > 1e-4).any()):
            raise ValueError(
                f"layer {layer}: real queries attend to positions that attention_mask marks as padding: "
                "run the model with the same mask (model.run_with_cache(tokens, attention_mask=mask))"
            )
        pattern = pattern * (mask[:, None, :, None] & mask[:, None, None, :])
        v = v * mask[:, :, None, None]
    view = AttentionLayer(
        layer=layer,
        pattern=pattern,
        v=v,
        W_O=W_O,
        b_O=b_O,
        n_kv_heads=n_kv,
        model_mode=adapter.model_mode,
        query_mask=query_mask,
        key_mask=key_mask,
        causal=adapter.is_causal and n_q == n_k,
        z_hint=z_hint,
    )
    # the config says causal; the pattern must agree, else every key is read (a bidirectional model)
    if view.causal and any(
        _nonzero(view.pattern[..., queries, k_end:]) for queries, k_end in view.query_blocks() if k_end < n_k
    ):
        view.causal = False
    return view


def _nonzero(x: Tensor) -> bool:
    """Whether any entry of ``x`` is not 0 (NaN counts): min and max in one vectorised pass,
    about 3× faster than ``x.any()`` on a float slice."""
    low, high = torch.aminmax(x)
    return bool(low != 0) or bool(high != 0)


def check_unpadded(
    pattern: Float[Tensor, "batch head query key"], *, window: int | None = None, layer: int = 0
) -> None:
    """Refuse a padded batch given without its ``attention_mask``.

    The final query of a causal row sees every key (within its sliding window). A key it gives
    exactly zero attention in every head was masked out, i.e. the row is padded (left padding
    masks the first keys, right padding the final query itself).
    """
    last = pattern[:, :, -1, :]
    if window is not None:
        last = last[..., max(0, last.shape[-1] - window) :]
    masked = (last == 0).all(dim=1)
    if bool(masked.any()):
        rows = masked.any(dim=-1).nonzero().flatten().tolist()
        raise ValueError(
            f"layer {layer}: batch rows {rows[:8]} look padded (the final query gives exactly zero "
            "attention to some key in every head): pass the mask the model was run with, "
            "attention_mask= (1 = real token), so that padded positions are excluded and each row's "
            "first real token is its sink."
        )
