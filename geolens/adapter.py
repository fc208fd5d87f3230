"""The one module that knows model families and TransformerLens versions (docs/method.md §0).

geolens reads three things from a forward pass, per layer, in TransformerLens layouts:

- ``pattern`` α: ``[batch, head, query_pos, key_pos]`` (``blocks.{l}.attn.hook_pattern``)
- ``v``: ``[batch, key_pos, head, d_head]`` (``blocks.{l}.attn.hook_v``), grouped-query value
  heads expanded so that query head h reads kv head ``h // (n_heads // n_kv_heads)``
  (``repeat_interleave``, as TransformerLens itself does; :func:`kv_group_size` is the one
  implementation of that rule)
- ``W_O``: ``[head, d_head, d_model]`` and ``b_O``: ``[d_model]`` (zeros for bias-free models)

and derives z_i^h = Σ_j α_ij^h v_j^h (``hook_z``), so that Σ_h z^h W_O^h + b_O is the pre-norm
attention output.

Everything family-specific lives on a :class:`ModelAdapter`, one class per model family, which
:func:`adapter_for` picks (and caches) for a model:

- :class:`BridgeAdapter`: TransformerLens 4.x ``TransformerBridge`` (its pre-norm attention
  output is ``blocks.{l}.attn.hook_out``; sliding windows are read from the HF config, because
  TL's cfg does not report them, docs/tl-notes.md);
- :class:`GemmaBridgeAdapter`: a bridge whose blocks apply a norm after attention (Gemma 2/3:
  ``blocks.{l}.hook_attn_out`` comes after it);
- :class:`HookedAdapter`: TransformerLens 2.x/3.x ``HookedTransformer`` (whose ``W_V`` is already
  repeated to n_heads while ``hook_v`` keeps n_kv_heads; its attention module has no
  ``hook_out``, and ``blocks.{l}.hook_attn_out`` is the pre-norm attention output);
- :class:`GemmaHookedAdapter`: a ``HookedTransformer`` with a post-attention norm (there the
  pre-norm attention output has no hook at all).

The free functions of this module (:func:`model_mode`, :func:`n_kv_heads`,
:func:`attn_out_hook`, :func:`output_weights`, :func:`sliding_window`, ...) are thin delegates
to ``adapter_for(model)``. Everything else in geolens goes through them,
:func:`get_attention_layer` and :func:`names_filter`; no other module branches on the model
family or the TransformerLens version (``tests/test_adapter.py`` scans for it).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, ClassVar, Iterable, Protocol

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from geolens.validation import check_attention_mask, check_cache_layers, check_dtype, check_layer

PATTERN = "attn.hook_pattern"
VALUE = "attn.hook_v"
Z = "attn.hook_z"
RESID_PRE = "hook_resid_pre"
RESID_POST = "hook_resid_post"
ATTN_OUT = "hook_attn_out"  # what a block adds to the residual stream (after any post-attention norm)

_BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.")


def hook_name(layer: int, name: str) -> str:
    """``blocks.{layer}.{name}``, as ``transformer_lens.utils.get_act_name`` spells block hooks."""
    return f"blocks.{layer}.{name}"


def hook_layer(name: str) -> int | None:
    """The layer of a block hook name (the inverse of :func:`hook_name`), None for other hooks."""
    match = _BLOCK_HOOK.match(str(name))
    return None if match is None else int(match.group(1))


class TLModel(Protocol):
    """What geolens reads of a model: the structural surface of TransformerLens 4.3's
    ``transformer_lens.model_protocol.TransformerLensModel`` (``cfg``, ``run_with_cache``,
    ``run_with_hooks``, ``to_tokens``) plus ``blocks``, which a ``TransformerBridge`` and a
    ``HookedTransformer`` both have. Typing only: TL 2.x has no such module, and geolens
    never checks it at runtime (minimal stand-ins with ``cfg`` and ``blocks`` are accepted)."""

    @property
    def cfg(self) -> Any: ...

    @property
    def blocks(self) -> Any: ...

    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def to_tokens(self, *args: Any, **kwargs: Any) -> Any: ...


# ---------------------------------------------------------------------------------------------
# Grouped-query attention: the one rule


def kv_group_size(n_heads: int, n_kv_heads: int, *, what: str = "the model") -> int:
    """Query heads per kv head; query head h reads kv head ``h // kv_group_size(n_heads, n_kv_heads)``.

    This is TransformerLens' (and HF's) ``repeat_interleave`` pairing; ``repeat`` would pair heads
    wrongly (docs/tl-notes.md). ``what`` names the tensor in the error when n_kv_heads does not
    divide n_heads.
    """
    n_heads, n_kv_heads = int(n_heads), int(n_kv_heads)
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{what} has {n_kv_heads} heads, which does not divide n_heads={n_heads}")
    return n_heads // n_kv_heads


def kv_head_of(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The kv head that query ``head`` reads (:func:`kv_group_size`)."""
    return int(head) // kv_group_size(n_heads, n_kv_heads)


def expand_kv_heads(
    v: Float[Tensor, "batch key kv_head d_head"], n_heads: int, *, dim: int = 2, what: str = "hook_v"
) -> Float[Tensor, "batch key head d_head"]:
    """Align grouped-query heads (axis ``dim``) with query heads: head h reads kv head h // group.

    Returns ``v`` itself when it already has ``n_heads`` heads.
    """
    kv = v.shape[dim]
    if kv == n_heads:
        return v
    return v.repeat_interleave(kv_group_size(n_heads, kv, what=what), dim=dim)


def _zeros_if_missing(get: Callable[[], Tensor | None], shape: tuple[int, ...], like: Tensor) -> Tensor:
    """TL 4.x raises AttributeError for bias-free models and TL 3.9 TypeError (docs/tl-notes.md)."""
    try:
        value = get()
    except (AttributeError, TypeError):
        value = None
    if value is None:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    return value


# ---------------------------------------------------------------------------------------------
# Adapters: one class per model family


class ModelAdapter:
    """Everything geolens needs to know about one model's family, behind one object.

    Holds the model weakly (it is cached per model by :func:`adapter_for`). Static facts of the
    family (bridge or not, a post-attention norm) are class attributes; whatever a model can
    change after loading (compatibility mode, its config) is read live.

    To support another architecture, subclass the closest family, override what differs
    (a hook name, a weight layout, :meth:`sliding_window`), give it a :meth:`matches` test and
    put it in :data:`FAMILIES` ahead of its parent.
    """

    family: ClassVar[str] = "model"
    is_bridge: ClassVar[bool] = False
    post_attention_norm: ClassVar[bool] = False  # blocks.L.hook_attn_out comes after a norm

    def __init__(self, model: TLModel):
        try:
            self._ref: Callable[[], TLModel | None] = weakref.ref(model)
        except TypeError:  # a stand-in that cannot be weakly referenced (not cached either)
            self._ref = lambda: model
        self._compute_W_O: dict[tuple, tuple] = {}
        self._probes: dict[tuple, Tensor] = {}

    @classmethod
    def matches(cls, model) -> bool:
        raise NotImplementedError

    @property
    def model(self) -> TLModel:
        model = self._ref()
        if model is None:
            raise ReferenceError("the model of this adapter no longer exists")
        return model

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self._ref()).__name__})"

    # --- numerics recorded with every result

    @property
    def model_mode(self) -> str:
        """Which TransformerLens numerics produced a cache: ``"bridge"``, ``"bridge-compat"`` or ``"hooked"``."""
        raise NotImplementedError

    # --- heads

    @property
    def n_heads(self) -> int:
        return int(self.model.cfg.n_heads)

    @property
    def n_kv_heads(self) -> int:
        cfg = self.model.cfg
        n = getattr(cfg, "n_key_value_heads", None)
        return int(n) if n else int(cfg.n_heads)

    @property
    def group_size(self) -> int:
        """Query heads per kv head (1 without grouped-query attention)."""
        return kv_group_size(self.n_heads, self.n_kv_heads)

    def kv_head_of(self, head: int) -> int:
        """The kv head that query ``head`` reads."""
        return kv_head_of(head, self.n_heads, self.n_kv_heads)

    def query_heads_of(self, kv_heads: Iterable[int]) -> tuple[int, ...]:
        """The query heads reading any of ``kv_heads``, ascending by kv head, then by head."""
        kv = sorted(set(int(k) for k in kv_heads))
        return tuple(h for k in kv for h in range(self.n_heads) if self.kv_head_of(h) == k)

    def expand_kv(self, x: Tensor, *, dim: int = 2, what: str = "hook_v") -> Tensor:
        """``x`` with its kv-head axis ``dim`` expanded to the model's query heads."""
        return expand_kv_heads(x, self.n_heads, dim=dim, what=what)

    # --- hook names

    @property
    def is_causal(self) -> bool:
        """Whether every layer's query i attends to keys j ≤ i only (TransformerLens' ``attention_dir``)."""
        return getattr(self.model.cfg, "attention_dir", "causal") == "causal"

    def pattern_hook(self, layer: int) -> str:
        return hook_name(layer, PATTERN)

    def value_hook(self, layer: int) -> str:
        return hook_name(layer, VALUE)

    def z_hook(self, layer: int) -> str:
        return hook_name(layer, Z)

    def resid_pre_hook(self, layer: int) -> str:
        """The residual stream entering block ``layer``."""
        return hook_name(layer, RESID_PRE)

    def resid_post_hook(self, layer: int) -> str:
        """The residual stream leaving block ``layer``."""
        return hook_name(layer, RESID_POST)

    def block_attn_out_hook(self, layer: int) -> str:
        """What block ``layer`` adds to the residual stream from attention (after any post-attention norm)."""
        return hook_name(layer, ATTN_OUT)

    def attn_out_hook(self, layer: int) -> str:
        """The hook holding the pre-norm attention output Σ_h z^h W_O^h + b_O."""
        raise NotImplementedError

    @property
    def logits_hook(self) -> str:
        """The cache entry from which :meth:`logits_from_cache` gets the logits."""
        raise NotImplementedError

    @property
    def unembed_input_hook(self) -> str:
        """A hook ``[batch, pos, d_model]`` followed only by position-wise maps up to the logits."""
        raise NotImplementedError

    def logits_from_cache(self, cache) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits of the cached forward pass (see :attr:`logits_hook`)."""
        raise NotImplementedError

    def required_hook_names(self, layers: Iterable[int] | None = None, *, with_attn_out: bool = False) -> list[str]:
        """The cache entries geolens reads: pattern, v and z per layer (plus the attention output).
        z is optional (:attr:`AttentionLayer.z` recomputes it from α and v when the cache lacks it)
        but saves that product; it is used only once a random projection of it agrees with α and v."""
        layers = range(self.model.cfg.n_layers) if layers is None else layers
        names = []
        for l in layers:
            names += [self.pattern_hook(l), self.value_hook(l), self.z_hook(l)]
            if with_attn_out:
                names.append(self.attn_out_hook(l))
        return names

    # --- weights

    def output_weights(self, layer: int) -> tuple[Float[Tensor, "head d_head d_model"], Float[Tensor, "d_model"]]:
        """(W_O, b_O) of one layer in TL layout; b_O is zeros when the model has none."""
        cfg = self.model.cfg
        attn = self.model.blocks[layer].attn
        W_O = attn.W_O
        if W_O.ndim == 2:  # some bridge components keep nn.Linear layout [d_model, head*d_head]
            W_O = W_O.T.reshape(cfg.n_heads, cfg.d_head, cfg.d_model)
        b_O = _zeros_if_missing(lambda: attn.b_O, (cfg.d_model,), W_O)
        return W_O, b_O

    def compute_output_weights(self, layer: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        """:meth:`output_weights` detached and cast for computation. W_O comes back as the *same*
        tensor object while the weight is unchanged, so quantities cached on it (the Gram
        matrices of :func:`geolens.geometry.gram`) are reused across calls. "Unchanged" means the
        same parameter object, storage, layout and version counter *and* the same content
        fingerprint (float64 sums of the entries and of their product with a fixed random probe,
        over the storage W_O views, read in place, or over W_O's own entries when that storage is
        much larger): writes through ``.data`` do not move the version counter, the fingerprint
        catches them."""
        W_O, b_O = self.output_weights(layer)
        b_O = b_O.detach().to(device=device, dtype=dtype)
        root = W_O
        while root._base is not None:
            root = root._base
        try:
            state = (W_O.data_ptr(), W_O.storage_offset(), tuple(W_O.shape), W_O.stride(), W_O.dtype, W_O._version)
        except RuntimeError:  # an inference tensor keeps no version counter: never cached
            return W_O.detach().to(device=device, dtype=dtype), b_O
        # fingerprint the storage W_O views (a bridge's W_O is a transposed view of the Linear
        # weight, which reshape(-1) would copy on every call), unless that storage is much larger
        # than W_O (a flat buffer of many parameters): then W_O's own entries, copied
        flat = root.detach()
        in_place = flat.is_contiguous() and flat.numel() <= 4 * W_O.numel()
        flat = flat.view(-1) if in_place else W_O.detach().reshape(-1)
        # float32 probe, float64 sums: in a bf16 or fp16 weight, a sum rounded in the weight's own
        # dtype would not see a change of one entry
        probe = self._probes.get((flat.numel(), flat.device))
        if probe is None:
            probe = torch.randn(flat.numel(), generator=torch.Generator().manual_seed(flat.numel())).to(flat.device)
            self._probes[(flat.numel(), flat.device)] = probe
        state += (float(torch.sum(flat, dtype=torch.float64)), float(torch.sum(flat * probe, dtype=torch.float64)))
        key = (layer, dtype, str(device))
        hit = self._compute_W_O.get(key)
        if hit is not None and hit[0]() is root and hit[1] == state:
            return hit[2], b_O
        out = W_O.detach().to(device=device, dtype=dtype)
        self._compute_W_O[key] = (weakref.ref(root), state, out)
        return out, b_O

    def value_weights(self, layer: int) -> tuple[Float[Tensor, "head d_model d_head"], Float[Tensor, "head d_head"]]:
        """(W_V, b_V) of one layer in TL layout, kv heads expanded to query heads; b_V is zeros
        when the model has none.

        A bridge keeps ``W_V`` with n_kv_heads heads, a ``HookedTransformer`` repeats it to
        n_heads: both come back with n_heads. A 2-D ``W_V`` (nn.Linear layout
        ``[kv_head*d_head, d_model]``, kept by bridge components without a config) is reshaped.
        """
        cfg = self.model.cfg
        attn = self.model.blocks[layer].attn
        W_V = attn.W_V
        if W_V.ndim == 2:
            W_V = W_V.reshape(-1, cfg.d_head, cfg.d_model).transpose(1, 2)
        if W_V.ndim != 3:
            raise ValueError(f"layer {layer}: W_V has shape {tuple(W_V.shape)}, expected [head, d_model, d_head]")
        b_V = _zeros_if_missing(lambda: attn.b_V, (W_V.shape[0], W_V.shape[2]), W_V)
        what = f"layer {layer}: W_V"
        return self.expand_kv(W_V, dim=0, what=what), self.expand_kv(b_V, dim=0, what=what)

    # --- the rest of a block

    def block_after_attention(
        self, layer: int, resid_pre: Float[Tensor, "... d_model"], attn_out: Float[Tensor, "... d_model"]
    ) -> Float[Tensor, "... d_model"]:
        """``blocks.{layer}.hook_resid_post`` from the block's input and its pre-norm attention
        output Σ_h z^h W_O^h + b_O, without running attention: the post-attention norm where the
        family has one (``ln1_post``), the residual add, then ``ln2``, the MLP and, after a
        post-attention norm, ``ln2_post``. Rows are independent, so any leading shape works.

        The model's own modules do the work (both TransformerLens families name them alike).
        Blocks that run attention and MLP in parallel are refused.
        """
        cfg = self.model.cfg
        if getattr(cfg, "parallel_attn_mlp", False):
            raise NotImplementedError(f"layer {layer}: blocks with parallel attention and MLP are not supported here")
        block = self.model.blocks[layer]
        if self.post_attention_norm:
            attn_out = block.ln1_post(attn_out)
        resid_mid = resid_pre + attn_out
        mlp_out = block.mlp(block.ln2(resid_mid))
        if self.post_attention_norm:
            mlp_out = block.ln2_post(mlp_out)
        return resid_mid + mlp_out

    def final_norm(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The model's final norm (``ln_final``) applied to a residual stream."""
        return self.model.ln_final(resid)

    # --- visible keys

    def sliding_window(self, layer: int) -> int | None:
        """The layer's sliding attention window, or None for full causal attention."""
        raise NotImplementedError

    # --- single-position forwards over a KV cache (geolens.per_term) -----------------------------

    def run_with_kv_cache(self, x: Tensor, kv_cache, **kwargs) -> Float[Tensor, "batch pos d_vocab"]:
        """``model(x, **kwargs)`` continuing ``kv_cache``, which the forward extends in place."""
        raise NotImplementedError

    def new_kv_cache(self):
        """An empty KV cache of this family, for one sequence."""
        raise NotImplementedError

    def forward_from_layer(self, resid: Float[Tensor, "batch pos d_model"], layer: int, **kwargs) -> Float[Tensor, "batch pos d_vocab"]:
        """The logits of the model run from ``resid``, the residual stream entering ``layer``
        (TransformerLens' ``start_at_layer``), without running the blocks before ``layer``.
        ``kwargs`` go to the model's forward (``past_kv_cache`` / ``past_key_values``,
        ``attention_mask``, ``position_ids``)."""
        return self.model(resid, start_at_layer=layer, **kwargs)

    def prefix_kv_cache(self, prefix: Int[Tensor, "1 pos"]):
        """The KV cache of a clean forward over ``prefix`` (None for an empty prefix): every position
        of every layer, no sliding-window cropping (:meth:`single_position_logits` applies windows)."""
        if prefix.shape[-1] == 0:
            return None
        kv_cache = self.new_kv_cache()
        self.run_with_kv_cache(prefix, kv_cache)
        return kv_cache

    def crop_kv_cache(self, kv_cache, n_pos: int):
        """A view of ``kv_cache`` (:meth:`prefix_kv_cache`) holding its first ``n_pos`` positions only
        (None for 0), sharing the tensors: one prefix cache of a whole text serves every query."""
        raise NotImplementedError

    def single_position_logits(
        self, resid: Float[Tensor, "row d_model"], layer: int, query: int, kv_cache
    ) -> Float[Tensor, "row d_vocab"]:
        """Logits at position ``query`` of each row of ``resid`` (the residual entering ``layer`` at
        ``query``), each row run alone through layers ``layer`` … L−1 over the clean ``kv_cache``
        of the positions before ``query`` (:meth:`prefix_kv_cache`). A caller's ``hook_z`` hook
        sees the rows flattened over (batch, position)."""
        raise NotImplementedError


class HookedAdapter(ModelAdapter):
    """TransformerLens 2.x/3.x ``HookedTransformer`` (and minimal stand-ins with ``cfg`` and ``blocks``)."""

    family = "hooked"

    @classmethod
    def matches(cls, model) -> bool:
        return True  # the fallback: anything that is not a bridge

    @property
    def model_mode(self) -> str:
        """``"hooked"``: HookedTransformer processes weights as ``enable_compatibility_mode()`` does."""
        return "hooked"

    def attn_out_hook(self, layer: int) -> str:
        if self.post_attention_norm:
            raise ValueError(
                "this HookedTransformer applies a norm after attention, so blocks.L.hook_attn_out is "
                "not the attention sum; use geolens.contributions.layer_output (Σ_h z W_O) instead"
            )
        return self.block_attn_out_hook(layer)

    @property
    def logits_hook(self) -> str:
        """``ln_final.hook_normalized``: HookedTransformer has no hook after the unembedding, so
        the final normalised residual is cached and unembedded."""
        return "ln_final.hook_normalized"

    @property
    def unembed_input_hook(self) -> str:
        """``ln_final.hook_normalized`` (``unembed`` has no input hook; only the norm weight follows)."""
        return "ln_final.hook_normalized"

    def logits_from_cache(self, cache) -> Float[Tensor, "batch pos d_vocab"]:
        return self.model.unembed(_cache_get(cache, self.logits_hook))

    def sliding_window(self, layer: int) -> int | None:
        """``cfg.window_size`` on layers whose ``cfg.attn_types`` entry is ``"local"``."""
        cfg = self.model.cfg
        attn_types = getattr(cfg, "attn_types", None)
        if attn_types is not None and attn_types[layer] == "local":
            return getattr(cfg, "window_size", None)
        return None

    def run_with_kv_cache(self, x: Tensor, kv_cache, **kwargs) -> Float[Tensor, "batch pos d_vocab"]:
        """``model(x, past_kv_cache=kv_cache, **kwargs)`` (a ``HookedTransformerKeyValueCache``).

        Token ids get an all-ones ``attention_mask``: given a cache, TransformerLens 2.x would
        otherwise derive one that masks trailing tokens equal to the pad token (GPT-2's pad is
        its BOS/EOS), so a text holding that token would be cached wrong.
        """
        if kv_cache is not None and "attention_mask" not in kwargs and not torch.is_floating_point(x):
            kwargs["attention_mask"] = torch.ones_like(x)
        return self.model(x, **kwargs, **({} if kv_cache is None else {"past_kv_cache": kv_cache}))

    def new_kv_cache(self):
        from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache

        return HookedTransformerKeyValueCache.init_cache(self.model.cfg, self.model.cfg.device, 1)

    def crop_kv_cache(self, kv_cache, n_pos):
        from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry

        if kv_cache is None or n_pos == 0:
            return None
        entries = [HookedTransformerKeyValueCacheEntry(e.past_keys[:, :n_pos], e.past_values[:, :n_pos], frozen=True) for e in kv_cache.entries]
        return HookedTransformerKeyValueCache(entries=entries, previous_attention_mask=kv_cache.previous_attention_mask[:, :n_pos], frozen=True)

    def single_position_logits(self, resid, layer, query, kv_cache):
        """The rows are a batch over a frozen copy of the cache, expanded (as views) over the
        batch; ``start_at_layer`` skips the blocks before ``layer``."""
        from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry

        rows = resid.shape[0]
        if kv_cache is not None:
            entries = [
                HookedTransformerKeyValueCacheEntry(e.past_keys.expand(rows, -1, -1, -1), e.past_values.expand(rows, -1, -1, -1), frozen=True)
                for e in kv_cache.entries
            ]
            mask = kv_cache.previous_attention_mask.expand(rows, -1)
            kv_cache = HookedTransformerKeyValueCache(entries=entries, previous_attention_mask=mask, frozen=True)
        return self.run_with_kv_cache(resid[:, None], kv_cache, start_at_layer=layer)[:, -1]


class GemmaHookedAdapter(HookedAdapter):
    """A ``HookedTransformer`` with a norm after attention (``cfg.use_normalization_before_and_after``)."""

    family = "hooked-gemma"
    post_attention_norm = True

    @classmethod
    def matches(cls, model) -> bool:
        return bool(getattr(model.cfg, "use_normalization_before_and_after", False))


def _looks_like_bridge(model: TLModel) -> bool:
    """A TransformerLens 4.x ``TransformerBridge``, duck-typed on ``original_model`` and ``adapter``."""
    return hasattr(model, "original_model") and hasattr(model, "adapter")


class BridgeAdapter(ModelAdapter):
    """TransformerLens 4.x ``TransformerBridge`` over an HF model."""

    family = "bridge"
    is_bridge = True

    @classmethod
    def matches(cls, model) -> bool:
        return _looks_like_bridge(model)

    @property
    def model_mode(self) -> str:
        """``"bridge"`` (raw HF weights) or ``"bridge-compat"`` (after ``enable_compatibility_mode()``:
        norms folded, W_O centred for LayerNorm models, b_V folded into b_O, which changes ṽ)."""
        return "bridge-compat" if getattr(self.model, "compatibility_mode", False) else "bridge"

    def attn_out_hook(self, layer: int) -> str:
        return hook_name(layer, "attn.hook_out")

    @property
    def logits_hook(self) -> str:
        """``unembed.hook_out``: the logits themselves."""
        return "unembed.hook_out"

    @property
    def unembed_input_hook(self) -> str:
        return "unembed.hook_in"

    def logits_from_cache(self, cache) -> Float[Tensor, "batch pos d_vocab"]:
        return _cache_get(cache, self.logits_hook)

    def sliding_window(self, layer: int) -> int | None:
        """TL's cfg reports ``window_size=None`` for Gemma 3 although its local layers use a
        512-token window (docs/tl-notes.md), so the HF config's ``layer_types`` is read."""
        hf_cfg = getattr(self.model.original_model, "config", None)
        hf_cfg = getattr(hf_cfg, "text_config", None) or hf_cfg
        types = getattr(hf_cfg, "layer_types", None)
        if types is not None and types[layer] == "sliding_attention":
            return getattr(hf_cfg, "sliding_window", None)
        return None

    def run_with_kv_cache(self, x: Tensor, kv_cache, **kwargs) -> Float[Tensor, "batch pos d_vocab"]:
        """``model(x, past_key_values=kv_cache, **kwargs)`` (a Hugging Face ``DynamicCache``).

        TransformerLens 4.3's attention bridge reads its KV cache from the keyword
        ``past_key_values``, which transformers 5.24 renamed ``cache`` in the call it makes to each
        attention module, so the cache would be silently ignored (docs/tl-notes.md): a pre-hook on
        each attention module, removed on any exit, hands it back under the old name.
        """
        import warnings

        def rename(module, args, kw):
            if kw.get("past_key_values") is None and kw.get("cache") is not None:
                kw["past_key_values"] = kw["cache"]
            return args, kw

        handles = [block.attn.register_forward_pre_hook(rename, with_kwargs=True) for block in self.model.blocks]
        try:
            with warnings.catch_warnings():  # transformers 5.24: "`past_key_values` is deprecated", which TL 4.3 passes
                warnings.filterwarnings("ignore", message=".*past_key_values.* is deprecated", category=FutureWarning)
                return self.model(x, **kwargs, **({} if kv_cache is None else {"past_key_values": kv_cache}))
        finally:
            for handle in handles:
                handle.remove()

    def new_kv_cache(self):
        from transformers import DynamicCache

        return DynamicCache()

    def forward_from_layer(self, resid, layer, **kwargs):
        """TransformerLens 4.3's ``start_at_layer`` still runs blocks 0 … layer−1 and then discards
        their output (docs/tl-notes.md), which costs as much as a full forward. Here those blocks
        are replaced, for this call only, by the identity (an instance ``forward`` removed on any
        exit), so the forward costs the blocks from ``layer`` on. The Hugging Face decoder loop
        passes the hidden states from block to block and each attention module keeps its own
        ``layer_idx`` for the KV cache, so nothing else depends on the skipped blocks."""
        layer = int(layer) % len(self.model.blocks)
        skipped = list(self.model.blocks)[:layer]

        def identity(hidden_states, *args, **kw):
            return hidden_states

        for block in skipped:  # object's setattr: a bridge component forwards attribute writes to the HF module
            object.__setattr__(block, "forward", identity)
        try:
            return self.run_with_kv_cache(resid, kwargs.pop("past_key_values", None), start_at_layer=layer, **kwargs)
        finally:
            for block in skipped:
                object.__delattr__(block, "forward")

    def crop_kv_cache(self, kv_cache, n_pos):
        import copy

        if kv_cache is None or n_pos == 0:
            return None
        cropped = copy.copy(kv_cache)
        cropped.layers = [copy.copy(entry) for entry in kv_cache.layers]
        for entry in cropped.layers:
            entry.keys, entry.values = entry.keys[..., :n_pos, :], entry.values[..., :n_pos, :]
        return cropped

    def single_position_logits(self, resid, layer, query, kv_cache):
        """The rows are packed as ``row`` new positions of *one* sequence, all at position ``query``
        (``position_ids``), with a 4-D mask letting row r see the cached keys (inside the layer's
        sliding window) and its own key only; the cache's keys and values are thus shared, never
        copied per row. The blocks before ``layer`` do not run (:meth:`forward_from_layer`)."""
        import copy

        rows = resid.shape[0]
        if kv_cache is not None:  # a shallow copy: the forward appends the rows' keys to the copy only
            kv_cache = copy.copy(kv_cache)
            kv_cache.layers = [copy.copy(entry) for entry in kv_cache.layers]
        hf_config = self.model.original_model.config
        hf_config = getattr(hf_config, "text_config", None) or hf_config
        masks = {}
        for name in set(getattr(hf_config, "layer_types", None) or ["full_attention"]):
            window = getattr(hf_config, "sliding_window", None) if name == "sliding_attention" else None
            seen = torch.ones(rows, query, dtype=torch.bool, device=resid.device)
            if window is not None:
                seen[:, : max(0, query - window + 1)] = False
            own = torch.eye(rows, dtype=torch.bool, device=resid.device)
            masks[name] = torch.cat([seen, own], dim=1)[None, None]
        mask = masks if len(masks) > 1 or getattr(hf_config, "layer_types", None) else masks["full_attention"]
        positions = torch.full((1, rows), query, dtype=torch.long, device=resid.device)
        return self.forward_from_layer(resid[None], layer, past_key_values=kv_cache, attention_mask=mask, position_ids=positions)[0]


class GemmaBridgeAdapter(BridgeAdapter):
    """A bridge whose blocks apply a norm after attention (Gemma 2/3): ``blocks.L.hook_attn_out``
    is then not the attention sum, ``attn.hook_out`` still is."""

    family = "bridge-gemma"
    post_attention_norm = True

    @classmethod
    def matches(cls, model) -> bool:
        if not _looks_like_bridge(model):
            return False
        if getattr(model.cfg, "use_normalization_before_and_after", False):
            return True
        block = model.blocks[0]
        return any(n in getattr(block, "_modules", {}) for n in ("ln1_post", "post_attention_layernorm"))


FAMILIES: list[type[ModelAdapter]] = [GemmaBridgeAdapter, BridgeAdapter, GemmaHookedAdapter, HookedAdapter]
"""Tried in order by :func:`adapter_for`; a specialised family comes before its parent."""

_ADAPTERS: "weakref.WeakKeyDictionary[Any, ModelAdapter]" = weakref.WeakKeyDictionary()


def adapter_for(model: TLModel) -> ModelAdapter:
    """The :class:`ModelAdapter` of ``model``'s family, built once per model and cached (weakly).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> from geolens.adapter import adapter_for
    >>> adapter = adapter_for(model)
    >>> type(adapter).__name__, adapter.n_kv_heads, adapter is adapter_for(model)
    ('BridgeAdapter', 2, True)
    """
    try:
        return _ADAPTERS[model]
    except (KeyError, TypeError):  # TypeError: a stand-in that cannot be weakly referenced
        pass
    adapter = next(cls for cls in FAMILIES if cls.matches(model))(model)
    try:
        _ADAPTERS[model] = adapter
    except TypeError:
        pass
    return adapter


# ---------------------------------------------------------------------------------------------
# Free functions (public API): delegates to adapter_for(model)


def is_bridge(model: TLModel) -> bool:
    """True for a TransformerLens 4.x ``TransformerBridge``."""
    return adapter_for(model).is_bridge


def model_mode(model: TLModel) -> str:
    """Which TransformerLens numerics produced a cache: recorded with every result.

    ``"bridge"`` (TL 4.x, raw HF weights), ``"bridge-compat"`` (after
    ``enable_compatibility_mode()``: norms folded, W_O centred for LayerNorm models, b_V folded
    into b_O, which changes ṽ) or ``"hooked"`` (TL 2.x/3.x ``HookedTransformer``, which processes
    weights the same way by default).
    """
    return adapter_for(model).model_mode


def n_kv_heads(model: TLModel) -> int:
    """Number of kv heads (n_heads without grouped-query attention)."""
    return adapter_for(model).n_kv_heads


def attn_out_hook(model: TLModel, layer: int) -> str:
    """Name of the hook holding the pre-norm attention output Σ_h z^h W_O^h + b_O."""
    return adapter_for(model).attn_out_hook(layer)


def has_post_attention_norm(model: TLModel) -> bool:
    """Whether ``blocks.L.hook_attn_out`` comes after a norm (Gemma 2/3)."""
    return adapter_for(model).post_attention_norm


def required_hook_names(model: TLModel, layers: Iterable[int] | None = None, *, with_attn_out: bool = False) -> list[str]:
    """The cache entries geolens reads: pattern, v and z per layer (plus the attention output)."""
    return adapter_for(model).required_hook_names(layers, with_attn_out=with_attn_out)


def names_filter(model: TLModel, layers: Iterable[int] | None = None, *, with_attn_out: bool = False) -> Callable[[str], bool]:
    """A ``names_filter`` for ``run_with_cache`` that keeps only what geolens reads.

    Example::

        logits, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model, layers=[1]))
    >>> sorted(cache.keys())
    ['blocks.1.attn.hook_pattern', 'blocks.1.attn.hook_v', 'blocks.1.attn.hook_z']
    """
    wanted = frozenset(required_hook_names(model, layers, with_attn_out=with_attn_out))
    return lambda name: name in wanted


def _cache_lookup(cache, name: str) -> Tensor | None:
    """``cache[name]`` or None when the cache lacks that entry."""
    try:
        return cache[name]
    except KeyError:
        return None


def _cache_get(cache, name: str) -> Tensor:
    found = _cache_lookup(cache, name)
    if found is not None:
        return found
    raise KeyError(
        f"the cache has no entry {name!r}. geolens needs hook_pattern and hook_v of each layer it "
        "analyses: run `model.run_with_cache(tokens, names_filter=geolens.names_filter(model))` "
        "(or cache everything with a plain run_with_cache)."
    )


def output_weights(model: TLModel, layer: int) -> tuple[Float[Tensor, "head d_head d_model"], Float[Tensor, "d_model"]]:
    """(W_O, b_O) of one layer in TL layout; b_O is zeros when the model has none."""
    return adapter_for(model).output_weights(layer)


def value_weights(model: TLModel, layer: int) -> tuple[Float[Tensor, "head d_model d_head"], Float[Tensor, "head d_head"]]:
    """(W_V, b_V) of one layer in TL layout with kv heads expanded to query heads (see
    :meth:`ModelAdapter.value_weights`)."""
    return adapter_for(model).value_weights(layer)


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
        return [(slice(s, min(s + size, n_q)), min(n_k, self.query_start + min(s + size, n_q))) for s in range(0, n_q, size)]

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
        return torch.randn(self.v.shape[-1], generator=generator, dtype=torch.float64).to(self.v.dtype).to(self.v.device)

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
    cfg = model.cfg
    layer = check_layer(layer, cfg.n_layers)
    dtype = check_dtype(dtype)
    check_cache_layers(model, cache)
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
        raise ValueError(f"layer {layer}: W_O has shape {tuple(W_O.shape)}, expected {(n_heads, v.shape[3], cfg.d_model)}")
    device = pattern.device
    pattern = pattern.to(dtype)
    v = expand_kv_heads(v.to(dtype), n_heads)
    query_mask = key_mask = z_hint = None
    if attention_mask is None:
        check_unpadded(pattern, window=adapter.sliding_window(layer), layer=layer)
        z_hint = _cache_lookup(cache, adapter.z_hook(layer))
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
    if view.causal and any(_nonzero(view.pattern[..., queries, k_end:]) for queries, k_end in view.query_blocks() if k_end < n_k):
        view.causal = False
    return view


def _nonzero(x: Tensor) -> bool:
    """Whether any entry of ``x`` is not 0 (NaN counts): min and max in one vectorised pass,
    about 3× faster than ``x.any()`` on a float slice."""
    low, high = torch.aminmax(x)
    return bool(low != 0) or bool(high != 0)


def sliding_window(model: TLModel, layer: int) -> int | None:
    """The layer's sliding attention window, or None for full causal attention.

    TL's cfg reports ``window_size=None`` for Gemma 3 although its local layers use a 512-token
    window (docs/tl-notes.md), so the HF config's ``layer_types`` is read when the model is a bridge.
    """
    return adapter_for(model).sliding_window(layer)


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


def logits_hook(model: TLModel) -> str:
    """The cache entry from which :func:`logits_from_cache` gets the logits.

    TransformerBridge: ``unembed.hook_out`` (the logits themselves). HookedTransformer has no
    hook after the unembedding, so its final normalised residual ``ln_final.hook_normalized``
    is cached and unembedded.
    """
    return adapter_for(model).logits_hook


def logits_from_cache(model: TLModel, cache) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits of the cached forward pass (see :func:`logits_hook`)."""
    return adapter_for(model).logits_from_cache(cache)


def unembed_input_hook(model: TLModel) -> str:
    """A hook whose activation ``[batch, pos, d_model]`` is followed only by position-wise maps
    up to the logits (so slicing positions there slices the logits, and saves the unembedding of
    the others): ``unembed.hook_in`` on a TransformerBridge, ``ln_final.hook_normalized`` on a
    HookedTransformer (whose ``unembed`` has no input hook; only the norm weight follows)."""
    return adapter_for(model).unembed_input_hook


# ---------------------------------------------------------------------------------------------
# The HF-native backend (geolens/hf): plain ``transformers`` models, one adapter per family, tried
# before the TransformerLens families (a PreTrainedModel is neither a bridge nor a HookedTransformer)

from geolens.hf.families import HF_FAMILIES  # noqa: E402  (imports ModelAdapter from this module)

FAMILIES[:0] = HF_FAMILIES
