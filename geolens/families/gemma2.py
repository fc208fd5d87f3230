"""Gemma 2: attention-logit and final-logit soft-capping, alternating sliding windows, and a norm
after attention (``post_attention_layernorm``) and after the MLP.

On TransformerLens ``blocks.{l}.hook_attn_out`` then comes after that norm: a bridge still has the
attention sum at ``attn.hook_out`` (:class:`~geolens.adapter.GemmaBridgeAdapter`), a
``HookedTransformer`` has no hook for it (:class:`~geolens.adapter.GemmaHookedAdapter`).
"""

from __future__ import annotations

from geolens.adapter import GemmaBridgeAdapter, GemmaHookedAdapter
from geolens.families.base import HFLayout, rotary_fields

NAME = "gemma2"
NOTE = "attention and final soft-capping, post-attention norm, alternating windows"
HF = HFLayout(
    family="hf-gemma2",
    class_name="Gemma2HF",
    doc="Gemma 2: attention-logit and final-logit soft-capping, alternating sliding windows, and a\n"
    "    norm after attention (``post_attention_layernorm``) and after the MLP.",
    model_types=("gemma2",),
    post_norm_name="post_attention_layernorm",
)
TL_ADAPTERS = (GemmaBridgeAdapter, GemmaHookedAdapter)


def gemma_fields(c) -> dict:
    """What Gemma 2 and 3 add to the Llama-like fields: the norms before and after, and the
    attention scale TransformerLens hard-codes for the released checkpoints (read from ``c``)."""
    return dict(use_normalization_before_and_after=True, attn_scale=c.query_pre_attn_scalar**0.5)


def hooked_config(c) -> tuple[dict, str]:
    fields = rotary_fields(c, grouped=True)
    fields.update(gemma_fields(c))
    fields.update(
        attn_scores_soft_cap=c.attn_logit_softcapping or -1.0,
        output_logits_soft_cap=c.final_logit_softcapping or -1.0,
    )
    return fields, "convert_gemma_weights"
