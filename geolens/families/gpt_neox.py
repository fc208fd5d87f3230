"""GPT-NeoX / Pythia: partial rotary, a fused per-head ``query_key_value`` and, by default,
attention and MLP in parallel on the block's input (``use_parallel_residual``)."""

from __future__ import annotations

from geolens.adapter import BridgeAdapter, HookedAdapter
from geolens.families.base import HFLayout

NAME = "gpt_neox"
NOTE = "parallel attention and MLP, partial rotary, fused per-head qkv"
HF = HFLayout(
    family="hf-gpt-neox",
    class_name="GPTNeoXHF",
    doc="GPT-NeoX / Pythia: partial rotary, a fused per-head ``query_key_value`` and, by default,\n"
    "    attention and MLP in parallel on the block's input (``use_parallel_residual``).",
    model_types=("gpt_neox",),
    final_norm_name="final_layer_norm",
    attention_name="attention",
    output_name="dense",
    value_name="query_key_value",
    value_layout="per_head_qkv",
)
TL_ADAPTERS = (BridgeAdapter, HookedAdapter)


def hooked_config(c) -> tuple[dict, str]:
    d_head = c.hidden_size // c.num_attention_heads
    fields = dict(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.layer_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        parallel_attn_mlp=c.use_parallel_residual,
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=round(c.rotary_pct * d_head),
        rotary_base=c.rotary_emb_base,
    )
    return fields, "convert_neox_weights"
