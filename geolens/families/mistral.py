"""Mistral: Llama with one sliding window on every layer (``config.sliding_window``)."""

from __future__ import annotations

from geolens.adapter import BridgeAdapter, HookedAdapter
from geolens.families.base import HFLayout, rotary_fields

NAME = "mistral"
NOTE = "sliding window on every layer"
HF = HFLayout(
    family="hf-mistral",
    class_name="MistralHF",
    doc="Mistral: Llama with one sliding window on every layer (``config.sliding_window``).",
    model_types=("mistral",),
    uniform_window=True,
)
TL_ADAPTERS = (BridgeAdapter, HookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    return rotary_fields(c, grouped=True), "convert_mistral_weights"
