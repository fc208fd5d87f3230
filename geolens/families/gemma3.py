"""Gemma 3 (text): Gemma 2's block (a norm after attention) with q/k norms, and local and global
rotary bases."""

from __future__ import annotations

from dataclasses import replace

from geolens.adapter import GemmaBridgeAdapter, GemmaHookedAdapter
from geolens.families import gemma2
from geolens.families.base import rotary_fields

NAME = "gemma3"
NOTE = "q/k norms, post-attention norm, alternating windows"
HF = replace(
    gemma2.HF,
    family="hf-gemma3",
    class_name="Gemma3HF",
    doc="Gemma 3 (text): Gemma 2's block with q/k norms, local and global rotary bases.",
    model_types=("gemma3_text", "gemma3"),
)
TL_ADAPTERS = (GemmaBridgeAdapter, GemmaHookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    fields = rotary_fields(c, qk_norm=True, grouped=True)
    fields.update(gemma2.gemma_fields(c))
    fields.update(rotary_base_local=c.rope_local_base_freq)
    return fields, "convert_gemma_weights"
