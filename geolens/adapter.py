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
from jaxtyping import Float
from torch import Tensor

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
            self.layer, self.pattern[:, :, queries], self.v, self.W_O, self.b_O, self.n_kv_heads, self.model_mode
        )


def get_attention_layer(model, cache, layer: int, *, dtype: torch.dtype = torch.float32) -> AttentionLayer:
    """Read pattern, v, W_O and b_O of ``layer`` from ``cache`` and check their shapes.

    Values are cast to ``dtype`` (float32 by default, also for bf16/fp16 models).
    """
    cfg = model.cfg
    if not 0 <= layer < cfg.n_layers:
        raise IndexError(f"layer {layer} out of range for a model with {cfg.n_layers} layers")
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
    W_O, b_O = output_weights(model, layer)
    if W_O.shape != (n_heads, v.shape[3], cfg.d_model):
        raise ValueError(f"layer {layer}: W_O has shape {tuple(W_O.shape)}, expected {(n_heads, v.shape[3], cfg.d_model)}")
    check_unpadded(pattern, window=sliding_window(model, layer), layer=layer)
    device = pattern.device
    return AttentionLayer(
        layer=layer,
        pattern=pattern.to(dtype),
        v=expand_kv_heads(v.to(dtype), n_heads),
        W_O=W_O.detach().to(device=device, dtype=dtype),
        b_O=b_O.detach().to(device=device, dtype=dtype),
        n_kv_heads=v.shape[2],
        model_mode=model_mode(model),
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
    """Refuse padded batches: the sink must be position 0 of every row (docs/method.md §0).

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
            "attention to some key in every head). geolens places the sink at position 0 and does "
            "not support padded batches: run sequences of equal length (geolens.data makes "
            "fixed-length windows) or one prompt at a time."
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
