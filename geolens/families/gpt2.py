"""GPT-2: learned absolute positions, LayerNorm, ``Conv1D`` projections (fused q/k/v in
``c_attn``), biases everywhere."""

from __future__ import annotations

from geolens.adapter import BridgeAdapter, HookedAdapter
from geolens.families.base import HFLayout


def refuse(config) -> str | None:
    """``reorder_and_upcast_attn=True`` bypasses ``transformers``' attention interface."""
    if getattr(config, "reorder_and_upcast_attn", False):
        return "hf-gpt2: reorder_and_upcast_attn=True bypasses the attention interface; it is not supported"
    return None


NAME = "gpt2"
NOTE = "absolute positions, LayerNorm, Conv1D, biases"
HF = HFLayout(
    family="hf-gpt2",
    class_name="GPT2HF",
    doc="GPT-2: learned absolute positions, LayerNorm, ``Conv1D`` projections (fused q/k/v in\n"
    "    ``c_attn``), biases everywhere.",
    model_types=("gpt2",),
    layers_name="h",
    final_norm_name="ln_f",
    attention_name="attn",
    output_name="c_proj",
    output_is_conv1d=True,
    value_name="c_attn",
    value_layout="conv1d_qkv",
    refuse=refuse,
)
TL_ADAPTERS = (BridgeAdapter, HookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    fields = dict(
        d_model=c.n_embd,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        n_layers=c.n_layer,
        n_ctx=c.n_positions,
        eps=c.layer_norm_epsilon,
        d_vocab=c.vocab_size,
        act_fn=c.activation_function,
        normalization_type="LN",
        positional_embedding_type="standard",
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx,
    )
    return fields, "convert_gpt2_weights"
