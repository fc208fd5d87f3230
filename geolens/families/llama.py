"""Llama (and SmolLM2): RMSNorm, rotary, grouped-query attention, separate q/k/v/o projections
without biases. The HF-native layout is the generic one (:class:`geolens.hf.base.HFAdapter`)."""

from __future__ import annotations

from geolens.adapter import BridgeAdapter, HookedAdapter
from geolens.families.base import HFLayout, rotary_fields

NAME = "llama"
NOTE = "RMSNorm, rotary, GQA"
HF = HFLayout(
    family="hf-llama",
    class_name="LlamaHF",
    doc="Llama and SmolLM2: RMSNorm, rotary, GQA, separate q/k/v/o projections without biases.",
    model_types=("llama",),
)
TL_ADAPTERS = (BridgeAdapter, HookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    return rotary_fields(c), "convert_llama_weights"
