"""Qwen2: biases on the q/k/v projections; sliding windows per layer (``layer_types``)."""

from __future__ import annotations

from geolens.adapter import BridgeAdapter, HookedAdapter
from geolens.families.base import HFLayout, rotary_fields

NAME = "qwen2"
NOTE = "q/k/v biases, sliding window on some layers"
HF = HFLayout(
    family="hf-qwen2",
    class_name="Qwen2HF",
    doc="Qwen2: biases on the q/k/v projections; sliding windows per layer (``layer_types``).",
    model_types=("qwen2",),
)
TL_ADAPTERS = (BridgeAdapter, HookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    return rotary_fields(c, grouped=True), "convert_qwen2_weights"
