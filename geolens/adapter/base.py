"""The base of every model family: :class:`ModelAdapter`, and :class:`TLModel`, what geolens reads
of a model (docs/method.md §0).

One subclass per family (:mod:`geolens.adapter.hooked`, :mod:`geolens.adapter.bridge`,
:mod:`geolens.adapter.gemma`, the HF-native families of :mod:`geolens.hf.families`, built from
:mod:`geolens.families`) overrides what differs; :func:`geolens.adapter.adapter_for` picks the
class of a model.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, ClassVar, Iterable, Protocol

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.layout import PATTERN, VALUE, Z, expand_kv_heads, hook_name, kv_group_size, kv_head_of

RESID_PRE = "hook_resid_pre"
RESID_POST = "hook_resid_post"
ATTN_OUT = "hook_attn_out"  # what a block adds to the residual stream (after any post-attention norm)


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


def _zeros_if_missing(get: Callable[[], Tensor | None], shape: tuple[int, ...], like: Tensor) -> Tensor:
    """TL 4.x raises AttributeError for bias-free models and TL 3.9 TypeError (docs/tl-notes.md)."""
    try:
        value = get()
    except (AttributeError, TypeError):
        value = None
    if value is None:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    return value


def _block_hook(suffix: str, doc: str) -> Callable[[Any, int], str]:
    """An adapter method ``(layer) -> "blocks.{layer}.<suffix>"``, the name of one hook of every block."""

    def block_hook(self, layer: int) -> str:
        return hook_name(layer, suffix)

    block_hook.__doc__ = doc
    return block_hook


class ModelAdapter:
    """Everything geolens needs to know about one model's family, behind one object.

    Holds the model weakly (it is cached per model by :func:`~geolens.adapter.adapter_for`). Static facts of the
    family (bridge or not, a post-attention norm) are class attributes; whatever a model can
    change after loading (compatibility mode, its config) is read live.

    To support another architecture, subclass the closest family, override what differs
    (a hook name, a weight layout, :meth:`sliding_window`), give it a :meth:`matches` test and
    register it (:func:`geolens.adapter.register_family`: it is then tried ahead of its parent).
    """

    family: ClassVar[str] = "model"
    is_bridge: ClassVar[bool] = False
    post_attention_norm: ClassVar[bool] = False  # blocks.L.hook_attn_out comes after a norm
    pre_mlp_norm: ClassVar[bool] = True  # the MLP reads ln2 of the residual stream (OLMo 2: no ln2)

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

    @property
    def cfg(self):
        """The model's TransformerLens-style config (``model.cfg``; the HF-native backend's view of
        the HF config, which a ``transformers`` model read by geolens does not carry)."""
        return self.model.cfg

    # --- heads

    @property
    def n_heads(self) -> int:
        return int(self.cfg.n_heads)

    @property
    def n_kv_heads(self) -> int:
        cfg = self.cfg
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
        return getattr(self.cfg, "attention_dir", "causal") == "causal"

    pattern_hook = _block_hook(PATTERN, "The attention pattern of block ``layer``, ``[batch, head, query, key]``.")
    value_hook = _block_hook(VALUE, "The values of block ``layer``, ``[batch, pos, kv_head, d_head]``.")
    z_hook = _block_hook(Z, "The attention-weighted values of block ``layer``, ``[batch, pos, head, d_head]``.")
    resid_pre_hook = _block_hook(RESID_PRE, "The residual stream entering block ``layer``.")
    resid_post_hook = _block_hook(RESID_POST, "The residual stream leaving block ``layer``.")
    block_attn_out_hook = _block_hook(
        ATTN_OUT, "What block ``layer`` adds to the residual stream from attention (after any post-attention norm)."
    )

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
        layers = range(self.cfg.n_layers) if layers is None else layers
        names = []
        for l in layers:
            names += [self.pattern_hook(l), self.value_hook(l), self.z_hook(l)]
            if with_attn_out:
                names.append(self.attn_out_hook(l))
        return names

    # --- weights

    def output_weights(self, layer: int) -> tuple[Float[Tensor, "head d_head d_model"], Float[Tensor, "d_model"]]:
        """(W_O, b_O) of one layer in TL layout; b_O is zeros when the model has none."""
        cfg = self.cfg
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
        cfg = self.cfg
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
        family has one (``ln1_post``), the residual add, then ``ln2`` (where the family has a norm
        before the MLP), the MLP and, after a post-attention norm, ``ln2_post``. Rows are
        independent, so any leading shape works.

        A block that runs attention and MLP in parallel on its input (GPT-NeoX, GPT-J:
        ``cfg.parallel_attn_mlp``) feeds the MLP ``resid_pre`` instead of the sum, as
        TransformerLens and Hugging Face do: resid_post = resid_pre + attn_out + MLP(ln2(resid_pre)).
        The model's own modules do the work (both TransformerLens families name them alike).
        """
        block = self.model.blocks[layer]
        if self.post_attention_norm:
            attn_out = self.attention_output_norm(layer)(attn_out)
        resid_mid = resid_pre + attn_out
        mlp_in = resid_pre if getattr(self.cfg, "parallel_attn_mlp", False) else resid_mid
        mlp_out = block.mlp(block.ln2(mlp_in) if self.pre_mlp_norm else mlp_in)
        if self.post_attention_norm:
            mlp_out = block.ln2_post(mlp_out)
        return resid_mid + mlp_out

    def attention_output_norm(self, layer: int):
        """The module applied to the attention output before the residual add (``ln1_post``), or
        None where the family has none."""
        return self.model.blocks[layer].ln1_post if self.post_attention_norm else None

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

    def forward_from_layer(
        self, resid: Float[Tensor, "batch pos d_model"], layer: int, **kwargs
    ) -> Float[Tensor, "batch pos d_vocab"]:
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
