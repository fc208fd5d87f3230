"""Gemma 2/3: blocks that apply a norm after attention (and after the MLP), on both TransformerLens
families. ``blocks.{l}.hook_attn_out`` then comes after the norm, so it is not the attention sum
Σ_h z^h W_O^h + b_O: a bridge still has that sum at ``attn.hook_out``, a ``HookedTransformer`` has
no hook for it.
"""

from __future__ import annotations

from geolens.adapter.bridge import BridgeAdapter, looks_like_bridge
from geolens.adapter.hooked import HookedAdapter
from geolens.adapter.olmo2 import post_norms_only


class GemmaHookedAdapter(HookedAdapter):
    """A ``HookedTransformer`` with a norm after attention (``cfg.use_normalization_before_and_after``)."""

    family = "hooked-gemma"
    post_attention_norm = True

    @classmethod
    def matches(cls, model) -> bool:
        return bool(getattr(model.cfg, "use_normalization_before_and_after", False))


class GemmaBridgeAdapter(BridgeAdapter):
    """A bridge whose blocks apply a norm after attention (Gemma 2/3): ``blocks.L.hook_attn_out``
    is then not the attention sum, ``attn.hook_out`` still is. Blocks with the norms after
    attention and MLP but none before the MLP are OLMo 2's (:mod:`geolens.adapter.olmo2`)."""

    family = "bridge-gemma"
    post_attention_norm = True

    @classmethod
    def matches(cls, model) -> bool:
        if not looks_like_bridge(model):
            return False
        if getattr(model.cfg, "use_normalization_before_and_after", False):
            return True
        block = model.blocks[0]
        return any(
            n in getattr(block, "_modules", {}) for n in ("ln1_post", "post_attention_layernorm")
        ) and not post_norms_only(model)
