"""The one module that knows TransformerLens versions (docs/method.md §0).

geolens reads three things from a forward pass, per layer, in TransformerLens layouts:

- ``pattern`` α: ``[batch, head, query_pos, key_pos]`` (``blocks.{l}.attn.hook_pattern``)
- ``v``: ``[batch, key_pos, head, d_head]`` (``blocks.{l}.attn.hook_v``), grouped-query value
  heads expanded so that query head h reads kv head ``h // (n_heads // n_kv_heads)``
  (``repeat_interleave``, as TransformerLens itself does)
- ``W_O``: ``[head, d_head, d_model]`` and ``b_O``: ``[d_model]`` (zeros for bias-free models)

and derives z_i^h = Σ_j α_ij^h v_j^h (``hook_z``), so that Σ_h z^h W_O^h + b_O is the pre-norm
attention output. Two model families are supported:

- TransformerLens 4.x ``TransformerBridge`` (its pre-norm attention output is
  ``blocks.{l}.attn.hook_out``; for Gemma ``blocks.{l}.hook_attn_out`` comes after the
  post-attention norm, docs/tl-notes.md);
- TransformerLens 2.x/3.x ``HookedTransformer`` (whose ``W_V`` is already repeated to n_heads
  while ``hook_v`` keeps n_kv_heads; its attention module has no ``hook_out``, and
  ``blocks.{l}.hook_attn_out`` is pre-norm unless the config uses a post-attention norm).

Everything else in geolens goes through :func:`get_attention_layer` and :func:`names_filter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from geolens.validation import check_attention_mask, check_cache_layers, check_dtype, check_layer

PATTERN = "attn.hook_pattern"
VALUE = "attn.hook_v"
Z = "attn.hook_z"


def hook_name(layer: int, name: str) -> str:
    """``blocks.{layer}.{name}``, as ``transformer_lens.utils.get_act_name`` spells block hooks."""
    return f"blocks.{layer}.{name}"


def is_bridge(model) -> bool:
    """True for a TransformerLens 4.x ``TransformerBridge`` (duck-typed on ``original_model``)."""
    return hasattr(model, "original_model") and hasattr(model, "adapter")


def model_mode(model) -> str:
    """Which TransformerLens numerics produced a cache: recorded with every result.

    ``"bridge"`` (TL 4.x, raw HF weights), ``"bridge-compat"`` (after
    ``enable_compatibility_mode()``: norms folded, W_O centred for LayerNorm models, b_V folded
    into b_O, which changes ṽ) or ``"hooked"`` (TL 2.x/3.x ``HookedTransformer``, which processes
    weights the same way by default).
    """
    if is_bridge(model):
        return "bridge-compat" if getattr(model, "compatibility_mode", False) else "bridge"
    return "hooked"


def n_kv_heads(model) -> int:
    cfg = model.cfg
    n = getattr(cfg, "n_key_value_heads", None)
    return int(n) if n else int(cfg.n_heads)


def attn_out_hook(model, layer: int) -> str:
    """Name of the hook holding the pre-norm attention output Σ_h z^h W_O^h + b_O."""
    if is_bridge(model):
        return hook_name(layer, "attn.hook_out")
    if has_post_attention_norm(model):
        raise ValueError(
            "this HookedTransformer applies a norm after attention, so blocks.L.hook_attn_out is "
            "not the attention sum; use geolens.contributions.layer_output (Σ_h z W_O) instead"
        )
    return hook_name(layer, "hook_attn_out")


def has_post_attention_norm(model) -> bool:
    """Whether ``blocks.L.hook_attn_out`` comes after a norm (Gemma 2/3)."""
    cfg = model.cfg
    if getattr(cfg, "use_normalization_before_and_after", False):
        return True
    if is_bridge(model):
        block = model.blocks[0]
        return any(n in getattr(block, "_modules", {}) for n in ("ln1_post", "post_attention_layernorm"))
    return False


def required_hook_names(model, layers: Iterable[int] | None = None, *, with_attn_out: bool = False) -> list[str]:
    """The cache entries geolens needs: pattern and v per layer (plus the attention output)."""
    layers = range(model.cfg.n_layers) if layers is None else layers
    names = []
    for l in layers:
        names += [hook_name(l, PATTERN), hook_name(l, VALUE)]
        if with_attn_out:
            names.append(attn_out_hook(model, l))
    return names


def names_filter(model, layers: Iterable[int] | None = None, *, with_attn_out: bool = False) -> Callable[[str], bool]:
    """A ``names_filter`` for ``run_with_cache`` that keeps only what geolens reads.

    Example::

        logits, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    """
    wanted = frozenset(required_hook_names(model, layers, with_attn_out=with_attn_out))
    return lambda name: name in wanted


def _cache_get(cache, name: str) -> Tensor:
    try:
        return cache[name]
    except KeyError:
        pass
    raise KeyError(
        f"the cache has no entry {name!r}. geolens needs hook_pattern and hook_v of each layer it "
        "analyses: run `model.run_with_cache(tokens, names_filter=geolens.names_filter(model))` "
        "(or cache everything with a plain run_with_cache)."
    )


def _zeros_if_missing(get: Callable[[], Tensor | None], shape: tuple[int, ...], like: Tensor) -> Tensor:
    """TL 4.x raises AttributeError for bias-free models and TL 3.9 TypeError (docs/tl-notes.md)."""
    try:
        value = get()
    except (AttributeError, TypeError):
        value = None
    if value is None:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    return value


def output_weights(model, layer: int) -> tuple[Float[Tensor, "head d_head d_model"], Float[Tensor, "d_model"]]:
    """(W_O, b_O) of one layer in TL layout; b_O is zeros when the model has none."""
    attn = model.blocks[layer].attn
    W_O = attn.W_O
    if W_O.ndim == 2:  # some bridge components keep nn.Linear layout [d_model, head*d_head]
        W_O = W_O.T.reshape(model.cfg.n_heads, model.cfg.d_head, model.cfg.d_model)
    b_O = _zeros_if_missing(lambda: attn.b_O, (model.cfg.d_model,), W_O)
    return W_O, b_O


def expand_kv_heads(v: Float[Tensor, "batch key kv_head d_head"], n_heads: int) -> Float[Tensor, "batch key head d_head"]:
    """Align grouped-query value heads with query heads: head h reads kv head h // group."""
    kv = v.shape[2]
    if kv == n_heads:
        return v
    if n_heads % kv != 0:
        raise ValueError(f"hook_v has {kv} heads, which does not divide n_heads={n_heads}")
    return v.repeat_interleave(n_heads // kv, dim=2)


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

    @property
    def n_heads(self) -> int:
        return self.pattern.shape[1]

    @cached_property
    def z(self) -> Float[Tensor, "batch query head d_head"]:
        """z_i^h = Σ_j α_ij^h v_j^h, what ``hook_z`` holds (recomputed in the compute dtype)."""
        return torch.einsum("bhqk,bkhd->bqhd", self.pattern, self.v)

    def query_slice(self, queries: slice) -> "AttentionLayer":
        """The same layer restricted to a range of query positions (for chunked computation)."""
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
        )


def get_attention_layer(
    model,
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
    """
    cfg = model.cfg
    layer = check_layer(layer, cfg.n_layers)
    dtype = check_dtype(dtype)
    check_cache_layers(model, cache)
    pattern = _cache_get(cache, hook_name(layer, PATTERN))
    v = _cache_get(cache, hook_name(layer, VALUE))
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
    if v.shape[2] != n_kv_heads(model) or v.shape[3] != cfg.d_head:
        raise ValueError(
            f"layer {layer}: hook_v has {v.shape[2]} kv heads of size {v.shape[3]}, the model has "
            f"{n_kv_heads(model)} kv heads of size {cfg.d_head}: the cache comes from another model"
        )
    W_O, b_O = output_weights(model, layer)
    if W_O.shape != (n_heads, v.shape[3], cfg.d_model):
        raise ValueError(f"layer {layer}: W_O has shape {tuple(W_O.shape)}, expected {(n_heads, v.shape[3], cfg.d_model)}")
    device = pattern.device
    pattern = pattern.to(dtype)
    v = expand_kv_heads(v.to(dtype), n_heads)
    query_mask = key_mask = None
    if attention_mask is None:
        check_unpadded(pattern, window=sliding_window(model, layer), layer=layer)
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
    return AttentionLayer(
        layer=layer,
        pattern=pattern,
        v=v,
        W_O=W_O.detach().to(device=device, dtype=dtype),
        b_O=b_O.detach().to(device=device, dtype=dtype),
        n_kv_heads=n_kv_heads(model),
        model_mode=model_mode(model),
        query_mask=query_mask,
        key_mask=key_mask,
    )


def sliding_window(model, layer: int) -> int | None:
    """The layer's sliding attention window, or None for full causal attention.

    TL's cfg reports ``window_size=None`` for Gemma 3 although its local layers use a 512-token
    window (docs/tl-notes.md), so the HF config's ``layer_types`` is read when the model is a bridge.
    """
    if is_bridge(model):
        hf_cfg = getattr(model.original_model, "config", None)
        hf_cfg = getattr(hf_cfg, "text_config", None) or hf_cfg
        types = getattr(hf_cfg, "layer_types", None)
        if types is not None and types[layer] == "sliding_attention":
            return getattr(hf_cfg, "sliding_window", None)
        return None
    attn_types = getattr(model.cfg, "attn_types", None)
    if attn_types is not None and attn_types[layer] == "local":
        return getattr(model.cfg, "window_size", None)
    return None


def check_unpadded(pattern: Float[Tensor, "batch head query key"], *, window: int | None = None, layer: int = 0) -> None:
    """Refuse a padded batch given without its ``attention_mask``.

    The final query of a causal row sees every key (within its sliding window). A key it gives
    exactly zero attention in every head was masked out, i.e. the row is padded (left padding
    masks the first keys, right padding the final query itself).
    """
    last = pattern[:, :, -1, :]
    if window is not None:
        last = last[..., max(0, last.shape[-1] - window):]
    masked = (last == 0).all(dim=1)
    if bool(masked.any()):
        rows = masked.any(dim=-1).nonzero().flatten().tolist()
        raise ValueError(
            f"layer {layer}: batch rows {rows[:8]} look padded (the final query gives exactly zero "
            "attention to some key in every head): pass the mask the model was run with, "
            "attention_mask= (1 = real token), so that padded positions are excluded and each row's "
            "first real token is its sink."
        )


def logits_hook(model) -> str:
    """The cache entry from which :func:`logits_from_cache` gets the logits.

    TransformerBridge: ``unembed.hook_out`` (the logits themselves). HookedTransformer has no
    hook after the unembedding, so its final normalised residual ``ln_final.hook_normalized``
    is cached and unembedded.
    """
    return "unembed.hook_out" if is_bridge(model) else "ln_final.hook_normalized"


def logits_from_cache(model, cache) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits of the cached forward pass (see :func:`logits_hook`)."""
    x = _cache_get(cache, logits_hook(model))
    return x if is_bridge(model) else model.unembed(x)


def unembed_input_hook(model) -> str:
    """A hook whose activation ``[batch, pos, d_model]`` is followed only by position-wise maps
    up to the logits (so slicing positions there slices the logits, and saves the unembedding of
    the others): ``unembed.hook_in`` on a TransformerBridge, ``ln_final.hook_normalized`` on a
    HookedTransformer (whose ``unembed`` has no input hook; only the norm weight follows)."""
    return "unembed.hook_in" if is_bridge(model) else "ln_final.hook_normalized"
