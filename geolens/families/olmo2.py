"""OLMo 2: q/k norms over all heads, and norms after attention and after the MLP (none before them).

A ``TransformerBridge``'s blocks hold ``ln1_post`` and ``ln2_post`` but no ``ln1``/``ln2``
(:class:`~geolens.adapter.Olmo2BridgeAdapter`); TransformerLens 2.x cannot hold it.
"""

from __future__ import annotations

from geolens.adapter import Olmo2BridgeAdapter
from geolens.families.base import HFLayout

NAME = "olmo2"
NOTE = "q/k norms, norms after attention and MLP"
HF = HFLayout(
    family="hf-olmo2",
    class_name="Olmo2HF",
    doc="OLMo 2: q/k norms over all heads, and norms after attention and after the MLP (no norm\n    before them).",
    model_types=("olmo2",),
    post_norm_name="post_attention_layernorm",
)
TL_ADAPTERS = (Olmo2BridgeAdapter,)
NOT_HOSTED_BY_TL2 = (
    "TransformerLens 2.18 has no OLMo 2 conversion, and no HookedTransformerConfig holds its norms "
    "(only after attention and MLP; q/k over all heads)"
)


def hooked_config(c) -> tuple[dict, str]:
    raise NotImplementedError(NOT_HOSTED_BY_TL2)
