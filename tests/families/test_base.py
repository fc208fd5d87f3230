"""What a family module declares (geolens.families.base): the adapter class attributes an
:class:`HFLayout` gives, and ``rotary_fields``, the ``HookedTransformerConfig`` fields of a
Llama-like HF config, against fields written out by hand for constructed configs."""

from __future__ import annotations

from types import SimpleNamespace

from geolens.families.base import HFLayout, rotary_fields


def test_class_attributes_copy_the_layout_and_derive_the_post_attention_norm():
    plain = HFLayout(family="hf-x", class_name="XHF", doc="X models.", model_types=("x",))
    attrs = plain.class_attributes()
    assert attrs["family"] == "hf-x" and attrs["model_types"] == ("x",) and attrs["__doc__"] == "X models."
    assert attrs["output_name"] == "o_proj" and attrs["value_layout"] == "separate"  # Llama's defaults
    assert attrs["post_attention_norm"] is False and "refuse" not in attrs
    assert "class_name" not in attrs and "doc" not in attrs

    def refuse(config):
        return "no" if config.bad else None

    normed = HFLayout("hf-y", "YHF", "Y.", ("y",), post_norm_name="post_attention_layernorm", refuse=refuse)
    attrs = normed.class_attributes()
    assert attrs["post_attention_norm"] is True and attrs["post_norm_name"] == "post_attention_layernorm"
    assert isinstance(attrs["refuse"], staticmethod)
    adapter_class = type("YHF", (), attrs)  # a staticmethod: callable on the class without an instance
    assert (
        adapter_class.refuse(SimpleNamespace(bad=True)) == "no"
        and adapter_class.refuse(SimpleNamespace(bad=False)) is None
    )


def _config(**changes):
    """An HF config of a Llama-like model: 4 heads of 8, 2 kv heads, 3 layers."""
    fields = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        num_hidden_layers=3,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        vocab_size=50,
        hidden_act="silu",
        rope_theta=10000.0,
    )
    fields.update(changes)
    return SimpleNamespace(**fields)


def test_rotary_fields_of_a_grouped_query_model():
    assert rotary_fields(_config()) == dict(
        d_model=32,
        d_head=8,
        n_heads=4,
        n_key_value_heads=2,
        d_mlp=64,
        n_layers=3,
        n_ctx=128,
        eps=1e-6,
        d_vocab=50,
        act_fn="silu",
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=8,
        rotary_adjacent_pairs=False,
        rotary_base=10000.0,
        use_qk_norm=False,
    )


def test_rotary_fields_options_head_dim_activation_and_grouping():
    mha = _config(num_key_value_heads=4)
    assert rotary_fields(mha)["n_key_value_heads"] is None  # not grouped: left unset
    assert rotary_fields(mha, grouped=True)["n_key_value_heads"] == 4  # set even when equal (Mistral, Gemma)
    wide = rotary_fields(_config(head_dim=16, hidden_activation="gelu_pytorch_tanh"), qk_norm=True)
    assert wide["d_head"] == wide["rotary_dim"] == 16  # an explicit head_dim wins over hidden_size / heads
    assert wide["act_fn"] == "gelu_pytorch_tanh" and wide["use_qk_norm"] is True


def test_rotary_fields_sliding_windows():
    assert "use_local_attn" not in rotary_fields(_config(sliding_window=None))
    every = rotary_fields(_config(sliding_window=8))  # a window and no layer types: every layer is local
    assert every["use_local_attn"] and every["window_size"] == 8 and every["attn_types"] == ["local"] * 3
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    mixed = rotary_fields(_config(sliding_window=8, layer_types=types))
    assert mixed["attn_types"] == ["local", "global", "local"]
    full = rotary_fields(_config(sliding_window=8, layer_types=["full_attention"] * 3))
    assert "use_local_attn" not in full and "attn_types" not in full  # a window no layer uses
