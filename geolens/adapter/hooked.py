"""TransformerLens 2.x/3.x ``HookedTransformer`` (and minimal stand-ins with ``cfg`` and ``blocks``):
building one (:func:`hooked_transformer`) and reading it (:class:`HookedAdapter`).

Its ``W_V`` is already repeated to n_heads while ``hook_v`` keeps n_kv_heads; its attention
module has no ``hook_out``, and ``blocks.{l}.hook_attn_out`` is the pre-norm attention output
(unless the block applies a norm after attention: :class:`geolens.adapter.gemma.GemmaHookedAdapter`).
"""

from __future__ import annotations

from typing import Callable

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter.base import ModelAdapter
from geolens.adapter.cache import _cache_get


def hooked_transformer(fields: dict, tokenizer, *, weights: Callable | None = None, **process):
    """A ``HookedTransformer`` built from ``HookedTransformerConfig(**fields)``.

    Randomly initialised, or, with ``weights`` (``cfg -> state dict``, e.g. TransformerLens'
    ``convert_llama_weights``), loaded with ``load_and_process_state_dict(state, **process)``.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(**fields)
    state = None if weights is None else weights(cfg)
    model = HookedTransformer(cfg, tokenizer=tokenizer)
    if state is not None:
        model.load_and_process_state_dict(state, **process)
    return model


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
                "not the attention sum; use geolens.layer_output (Σ_h z^h W_O^h, before b_O) instead"
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
        from transformer_lens.past_key_value_caching import (
            HookedTransformerKeyValueCache,
            HookedTransformerKeyValueCacheEntry,
        )

        if kv_cache is None or n_pos == 0:
            return None
        entries = [
            HookedTransformerKeyValueCacheEntry(e.past_keys[:, :n_pos], e.past_values[:, :n_pos], frozen=True)
            for e in kv_cache.entries
        ]
        return HookedTransformerKeyValueCache(
            entries=entries, previous_attention_mask=kv_cache.previous_attention_mask[:, :n_pos], frozen=True
        )

    def single_position_logits(self, resid, layer, query, kv_cache):
        """The rows are a batch over a frozen copy of the cache, expanded (as views) over the
        batch; ``start_at_layer`` skips the blocks before ``layer``."""
        from transformer_lens.past_key_value_caching import (
            HookedTransformerKeyValueCache,
            HookedTransformerKeyValueCacheEntry,
        )

        rows = resid.shape[0]
        if kv_cache is not None:
            entries = [
                HookedTransformerKeyValueCacheEntry(
                    e.past_keys.expand(rows, -1, -1, -1), e.past_values.expand(rows, -1, -1, -1), frozen=True
                )
                for e in kv_cache.entries
            ]
            mask = kv_cache.previous_attention_mask.expand(rows, -1)
            kv_cache = HookedTransformerKeyValueCache(entries=entries, previous_attention_mask=mask, frozen=True)
        return self.run_with_kv_cache(resid[:, None], kv_cache, start_at_layer=layer)[:, -1]
