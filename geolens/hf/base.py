"""The HF-native backend's adapter: :class:`HFAdapter`, a ``transformers`` decoder read through
its module layout (:class:`geolens.families.base.HFLayout`; the defaults are Llama's).

The family's layout names its modules (where the decoder layers, the attention module, its output
projection and value projection, a post-attention norm and the final norm are) and says what its
config means (a sliding window on every layer). The rest is read from the model itself and checked
against its own forward at the first use (:func:`geolens.hf.check.check_attention`):

- heads, kv heads, d_head: the config (GQA grouping as everywhere in geolens,
  :func:`geolens.adapter.kv_group_size`);
- pattern, v, z: captured inside the family's own eager attention (:mod:`geolens.hf.capture`), so
  soft-capping, q/k norms, partial rotary and sliding windows are the model's own code;
- W_O: the output projection reshaped per head (``nn.Linear`` ``[d_model, head·d_head]`` or GPT-2's
  ``Conv1D`` ``[head·d_head, d_model]``), b_O its bias or zeros;
- the rest of a block after attention (:meth:`HFAdapter.block_after_attention`): the decoder
  layer itself, run with its attention module answering the given attention output, so a
  post-attention norm (Gemma 2/3, OLMo 2), a parallel attention + MLP block (GPT-NeoX) or GPT-2's
  LayerNorm block needs no code of its own.

Building the adapter reads the model and changes nothing on it (no attribute, no hook): the
per-model state of the backend lives in :mod:`geolens.hf.backend`. The family classes are built
from :mod:`geolens.families` by :mod:`geolens.hf.families`; :class:`HFAdapter` itself is the generic
fallback (Llama's layout, refused by the load-time check when that assumption is wrong).
"""

from __future__ import annotations

import copy
import inspect
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import BridgeAdapter, ModelAdapter
from geolens.hf.backend import config, forward_logits
from geolens.hf.check import check_attention


class HFAdapter(ModelAdapter):
    """A ``transformers`` ``PreTrainedModel`` with Llama's module layout (the generic fallback).

    Hook names are TransformerLens' (``blocks.{l}.attn.hook_pattern``, ...); the pre-norm
    attention output is ``blocks.{l}.attn.hook_out`` (the attention module's output) and
    ``blocks.{l}.hook_attn_out`` what the block adds to the residual stream (after the
    post-attention norm where there is one). ``model_mode`` is ``"hf"``: raw Hugging Face weights,
    nothing folded.
    """

    family = "hf"
    model_types: ClassVar[tuple[str, ...]] = ()  # config.model_type values; () = any (the fallback)
    layers_name: ClassVar[str] = "layers"  # on model.base_model
    final_norm_name: ClassVar[str] = "norm"  # on model.base_model
    attention_name: ClassVar[str] = "self_attn"  # on a decoder layer
    output_name: ClassVar[str] = "o_proj"  # on the attention module
    output_is_conv1d: ClassVar[bool] = False  # GPT-2's Conv1D keeps [in, out]
    value_name: ClassVar[str] = "v_proj"  # on the attention module
    value_layout: ClassVar[str] = "separate"  # "separate", "qkv" ([q | k | v] rows), "conv1d_qkv", "per_head_qkv"
    post_norm_name: ClassVar[str | None] = None  # on a decoder layer: the norm applied to the attention output
    uniform_window: ClassVar[bool] = False  # config.sliding_window applies to every layer

    @staticmethod
    def refuse(config) -> str | None:
        """Why a model of this family cannot be read (None: it can); the family's layout says."""
        return None

    def __init__(self, model):
        super().__init__(model)
        reason = self.refuse(model.config)
        if reason is not None:
            raise ValueError(reason)
        self._check_layout()

    def check_attention(self, model) -> float:
        """The load-time check of the attention reading (:func:`geolens.hf.check.check_attention`)."""
        return check_attention(model)

    def _check_layout(self) -> None:
        """One clear error when the model does not have this family's modules."""
        model_type = getattr(self.config, "model_type", type(self.model).__name__)
        try:
            attn = self.attention_module(0)
            getattr(attn, self.output_name).weight
            getattr(self.decoder, self.final_norm_name)
        except (AttributeError, IndexError, TypeError):
            from geolens.families import hf_layouts

            known = sorted(t for layout in hf_layouts() for t in layout.model_types)
            raise ValueError(
                f"{model_type}: no geolens adapter for this model family ({type(self.model).__name__} does not have the "
                f"module layout of {self.family}); families with an adapter: {', '.join(known)}"
            ) from None

    @classmethod
    def matches(cls, model) -> bool:
        try:
            from transformers import PreTrainedModel
        except ImportError:
            return False
        if not isinstance(model, PreTrainedModel):
            return False
        return not cls.model_types or getattr(model.config, "model_type", None) in cls.model_types

    # --- the model's parts

    @property
    def config(self):
        """The Hugging Face config (its ``text_config`` where there is one)."""
        hf = self.model.config
        return getattr(hf, "text_config", None) or hf

    @property
    def cfg(self):
        """The TransformerLens-style config view (:func:`geolens.hf.backend.config`), held by the
        backend, not by the model."""
        return config(self.model)

    @property
    def decoder(self):
        """The decoder stack (``model.base_model``; transformers 4.x's Gemma 3 text model names
        itself there, its decoder is ``get_decoder()``)."""
        base = self.model.base_model
        if hasattr(base, self.layers_name) or not hasattr(self.model, "get_decoder"):
            return base
        return self.model.get_decoder()

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def layers(self):
        return getattr(self.decoder, self.layers_name)

    def layer_module(self, layer: int):
        return self.layers[layer]

    def attention_module(self, layer: int):
        return getattr(self.layers[layer], self.attention_name)

    def attention_output_norm(self, layer: int):
        """The module applied to the attention output before the residual add (None: nothing)."""
        return None if self.post_norm_name is None else getattr(self.layers[layer], self.post_norm_name)

    def unembed_module(self):
        return self.model.get_output_embeddings()

    # --- heads

    @property
    def n_heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def n_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)

    @property
    def d_head(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.config.hidden_size // self.n_heads)

    @property
    def d_model(self) -> int:
        return int(self.config.hidden_size)

    @property
    def model_mode(self) -> str:
        """``"hf"``: a plain ``transformers`` model, raw weights (nothing folded or centred)."""
        return "hf"

    @property
    def is_causal(self) -> bool:
        return True

    # --- hook names: the bridge's (attn.hook_out before any post-attention norm, unembed.hook_in/out)

    attn_out_hook = BridgeAdapter.attn_out_hook
    logits_hook = BridgeAdapter.logits_hook  # the model's final logits (after any final soft-capping)
    unembed_input_hook = BridgeAdapter.unembed_input_hook  # the output embedding's input (after the final norm)

    logits_from_cache = BridgeAdapter.logits_from_cache

    # --- weights

    def output_weights(self, layer: int) -> tuple[Float[Tensor, "head d_head d_model"], Float[Tensor, "d_model"]]:
        """(W_O, b_O) from the output projection, as views of its weight (so the Gram cache of
        :func:`geolens.geometry.gram` follows it)."""
        proj = getattr(self.attention_module(layer), self.output_name)
        weight = proj.weight
        if self.output_is_conv1d:  # [head·d_head, d_model]
            W_O = weight.reshape(self.n_heads, self.d_head, self.d_model)
        else:  # nn.Linear: [d_model, head·d_head]
            W_O = weight.T.reshape(self.n_heads, self.d_head, self.d_model)
        b_O = (
            proj.bias
            if getattr(proj, "bias", None) is not None
            else torch.zeros(self.d_model, dtype=W_O.dtype, device=W_O.device)
        )
        return W_O, b_O

    def value_weights(self, layer: int) -> tuple[Float[Tensor, "head d_model d_head"], Float[Tensor, "head d_head"]]:
        """(W_V, b_V) with kv heads expanded to query heads: v = x W_V + b_V for the attention
        module's input x (after the block's input norm)."""
        proj = getattr(self.attention_module(layer), self.value_name)
        kv, d, m = self.n_kv_heads, self.d_head, self.d_model
        weight, bias = proj.weight, getattr(proj, "bias", None)
        if self.value_layout == "separate":  # [kv·d, m]
            rows = slice(0, kv * d)
        elif self.value_layout == "qkv":  # [(h + 2 kv)·d, m]: q rows, k rows, v rows
            rows = slice((self.n_heads + kv) * d, (self.n_heads + 2 * kv) * d)
        elif self.value_layout == "conv1d_qkv":  # Conv1D [m, 3 m]: q, k, v columns
            W_V = weight[:, 2 * m :].reshape(m, kv, d).permute(1, 0, 2)
            b_V = torch.zeros(kv, d, dtype=weight.dtype) if bias is None else bias[2 * m :].reshape(kv, d)
            return self.expand_kv(W_V, dim=0), self.expand_kv(b_V, dim=0)
        elif self.value_layout == "per_head_qkv":  # [h·3·d, m]: per head q, k, v rows
            W_V = weight.reshape(kv, 3, d, m)[:, 2].transpose(1, 2)
            b_V = torch.zeros(kv, d, dtype=weight.dtype) if bias is None else bias.reshape(kv, 3, d)[:, 2]
            return self.expand_kv(W_V, dim=0), self.expand_kv(b_V, dim=0)
        else:
            raise ValueError(f"unknown value layout {self.value_layout!r}")
        W_V = weight[rows].reshape(kv, d, m).transpose(1, 2)
        b_V = torch.zeros(kv, d, dtype=weight.dtype) if bias is None else bias[rows].reshape(kv, d)
        return self.expand_kv(W_V, dim=0), self.expand_kv(b_V, dim=0)

    # --- the rest of a block

    def block_after_attention(self, layer, resid_pre, attn_out):
        """``blocks.{layer}.hook_resid_post`` from the block's input and its attention output:
        the decoder layer itself, run with its attention module returning ``attn_out`` (an
        instance ``forward``, removed on any exit). Whatever the layer does around attention
        (a post-attention norm, the residual adds, the MLP, in series or in parallel) is its own
        code. Rows are independent: any leading shape."""
        block, attn = self.layers[layer], self.attention_module(layer)
        shape = resid_pre.shape
        x = resid_pre.reshape(1, -1, shape[-1])
        given = attn_out.reshape(1, -1, shape[-1]).to(x.dtype)

        def answer(*args, **kwargs):
            return given, None

        object.__setattr__(attn, "forward", answer)
        try:
            out = block(x, **self._block_kwargs(block))
        finally:
            object.__delattr__(attn, "forward")
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(shape)

    def _block_kwargs(self, block) -> dict:
        """None for the required arguments of a decoder layer's forward besides the hidden
        states (its attention, which would read them, is answered)."""
        params = list(inspect.signature(block.forward).parameters.values())[1:]
        return {
            p.name: None
            for p in params
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def final_norm(self, resid):
        return getattr(self.decoder, self.final_norm_name)(resid)

    # --- visible keys

    def sliding_window(self, layer: int) -> int | None:
        """The attention module's own ``sliding_window`` (None on full-attention layers), or the
        config's for families that apply it to every layer (Mistral, Phi-3)."""
        if self.uniform_window:
            window = getattr(self.config, "sliding_window", None)
        else:
            window = getattr(self.attention_module(layer), "sliding_window", None)
        return None if window is None else int(window)

    # --- forwards (TransformerLens' start_at_layer, KV caches) -------------------------------

    @property
    def _cache_keyword(self) -> str:
        """``cache`` (transformers ≥ 5.24) or ``past_key_values`` in the model's forward."""
        params = inspect.signature(type(self.model).forward).parameters
        return "cache" if "cache" in params else "past_key_values"

    def hf_logits(self, **kwargs) -> Tensor:
        """The model's logits, run with the family's eager attention and every active hook."""
        return forward_logits(self.model, **kwargs)

    def run_with_kv_cache(self, x: Tensor, kv_cache, **kwargs) -> Float[Tensor, "batch pos d_vocab"]:
        """The logits of ``x`` (token ids) continuing ``kv_cache`` (a ``DynamicCache``, extended in place)."""
        if kv_cache is not None:
            kwargs[self._cache_keyword] = kv_cache
            kwargs["use_cache"] = True
        return self.hf_logits(input_ids=x, **kwargs)

    new_kv_cache = BridgeAdapter.new_kv_cache
    crop_kv_cache = BridgeAdapter.crop_kv_cache

    def forward_from_layer(self, resid, layer, **kwargs):
        """Logits of the model run from ``resid`` entering ``layer``: the blocks before it are the
        identity for this call, and a pre-hook hands ``resid`` to block ``layer`` (the embedding
        of a zero input, and GPT-2's position embedding, are discarded there). ``kwargs``:
        ``past_key_values``, ``attention_mask``, ``position_ids``."""
        layer = int(layer) % self.n_layers
        skipped = list(self.layers)[:layer]

        def identity(hidden_states, *args, **kw):
            return hidden_states

        def enter(module, args, kw):
            if args:
                return (resid, *args[1:]), kw
            return args, {**kw, "hidden_states": resid}

        cache = kwargs.pop("past_key_values", None)
        if cache is not None:
            kwargs[self._cache_keyword] = cache
            kwargs["use_cache"] = True
        for block in skipped:
            object.__setattr__(block, "forward", identity)
        handle = self.layers[layer].register_forward_pre_hook(enter, with_kwargs=True)
        try:
            return self.hf_logits(inputs_embeds=torch.zeros_like(resid), **kwargs)
        finally:
            handle.remove()
            for block in skipped:
                object.__delattr__(block, "forward")

    def single_position_logits(self, resid, layer, query, kv_cache):
        """The rows are a batch, each over the clean cache (its tensors expanded, as views, over
        the rows; the forward appends each row's own key and value), all at position ``query``;
        the model builds its own masks, sliding windows included. The blocks before ``layer`` do
        not run (:meth:`forward_from_layer`)."""
        rows = resid.shape[0]
        if kv_cache is not None:
            kv_cache = copy.copy(kv_cache)
            kv_cache.layers = [copy.copy(entry) for entry in kv_cache.layers]
            for entry in kv_cache.layers:
                entry.keys = entry.keys.expand(rows, *entry.keys.shape[1:])
                entry.values = entry.values.expand(rows, *entry.values.shape[1:])
        positions = torch.full((rows, 1), int(query), dtype=torch.long, device=resid.device)
        logits = self.forward_from_layer(resid[:, None], layer, past_key_values=kv_cache, position_ids=positions)
        return logits[:, -1]
