"""Qwen3: RMSNorm on each head's queries and keys (inside attention, before rotary)."""

from __future__ import annotations

from geolens.adapter import BridgeAdapter, HookedAdapter
from geolens.families.base import HFLayout, rotary_fields

NAME = "qwen3"
NOTE = "q/k norms"
HF = HFLayout(
    family="hf-qwen3",
    class_name="Qwen3HF",
    doc="Qwen3: RMSNorm on each head's queries and keys (inside attention, before rotary).",
    model_types=("qwen3",),
)
TL_ADAPTERS = (BridgeAdapter, HookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    return rotary_fields(c, qk_norm=True), "convert_qwen3_weights"
