"""Phi-3: one fused ``qkv_proj`` ([q | k | v] rows) and one sliding window on every layer."""

from __future__ import annotations

from geolens.adapter import BridgeAdapter, HookedAdapter
from geolens.families.base import HFLayout, rotary_fields

NAME = "phi3"
NOTE = "fused qkv projection, sliding window"
HF = HFLayout(
    family="hf-phi3",
    class_name="Phi3HF",
    doc="Phi-3: one fused ``qkv_proj`` ([q | k | v] rows) and one sliding window on every layer.",
    model_types=("phi3",),
    value_name="qkv_proj",
    value_layout="qkv",
    uniform_window=True,
)
TL_ADAPTERS = (BridgeAdapter, HookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    return rotary_fields(c), "convert_phi3_weights"
