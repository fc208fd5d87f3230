"""OLMo 2 on a TransformerLens 4.x ``TransformerBridge``: a norm after attention and after the MLP,
and none before them.

The bridge's blocks hold ``ln1_post`` and ``ln2_post`` but no ``ln1``/``ln2`` (TransformerLens 4.3,
docs/tl-notes.md): block ``l`` computes h = x + ln1_post(attn(x)), then h + ln2_post(MLP(h)).
``blocks.{l}.hook_attn_out`` comes after ``ln1_post``; ``attn.hook_out`` is still the attention sum
Σ_h z^h W_O^h + b_O. Gemma 2/3 blocks have the same post-norms plus the pre-norms
(:mod:`geolens.adapter.gemma`).
"""

from __future__ import annotations

from geolens.adapter.bridge import BridgeAdapter, looks_like_bridge


def post_norms_only(model) -> bool:
    """Whether the blocks of a bridge apply norms after attention and the MLP but none before the
    MLP (``ln1_post`` without ``ln2``), as OLMo 2's do."""
    modules = getattr(model.blocks[0], "_modules", {})
    return "ln1_post" in modules and "ln2" not in modules


class Olmo2BridgeAdapter(BridgeAdapter):
    """A bridge whose blocks have post-norms only (OLMo 2): the MLP reads the residual stream as it is."""

    family = "bridge-olmo2"
    post_attention_norm = True
    pre_mlp_norm = False

    @classmethod
    def matches(cls, model) -> bool:
        return looks_like_bridge(model) and post_norms_only(model)
