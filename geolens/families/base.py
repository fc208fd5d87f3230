"""What a family module declares (:mod:`geolens.families`), and the parts families share.

A family module (``geolens/families/<name>.py``) holds everything geolens knows about one model
family, as module-level names:

- ``NAME``: its name in the support matrix and :mod:`geolens.hf.tiny` (HF ``config.model_type``
  spelling, Gemma 3's text model aside);
- ``NOTE``: what its tiny model exercises (a column of docs/support.md);
- ``HF``: an :class:`HFLayout`, the HF-native backend's view of it: ``config.model_type`` values,
  module names (decoder layers, attention, output and value projections, final norm), the value
  projection's layout, the norm applied to the attention output, a sliding window on every layer;
  :mod:`geolens.hf.families` builds its adapter class from it;
- ``TL_ADAPTERS``: the :mod:`geolens.adapter` classes that read it on TransformerLens (a
  ``TransformerBridge``, a ``HookedTransformer``). They match a block layout, not a name (a norm
  after attention: :class:`~geolens.adapter.GemmaBridgeAdapter`), so they stay in
  :mod:`geolens.adapter`; ``tests/families/test_families.py`` checks that each family gets one of them;
- ``hooked_config(c)``: the TransformerLens 2.x ``HookedTransformerConfig`` fields for the HF
  config ``c`` and the name of TransformerLens' weight converter (or ``NotImplementedError`` where
  TransformerLens 2.x cannot hold the family), as :func:`geolens.families.convert.hooked_from_hf`
  uses them.

Nothing here imports ``transformers`` or TransformerLens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class HFLayout:
    """A Hugging Face decoder family's module layout, as the HF-native adapter reads it
    (:class:`geolens.hf.base.HFAdapter`: the defaults are Llama's)."""

    family: str  # the adapter's family name ("hf-llama")
    class_name: str  # the adapter class's name (LlamaHF)
    doc: str  # the adapter class's docstring
    model_types: tuple[str, ...]  # config.model_type values
    layers_name: str = "layers"  # on model.base_model
    final_norm_name: str = "norm"  # on model.base_model
    attention_name: str = "self_attn"  # on a decoder layer
    output_name: str = "o_proj"  # on the attention module
    output_is_conv1d: bool = False  # GPT-2's Conv1D keeps [in, out]
    value_name: str = "v_proj"  # on the attention module
    value_layout: str = "separate"  # "separate", "qkv" ([q | k | v] rows), "conv1d_qkv", "per_head_qkv"
    post_norm_name: str | None = None  # on a decoder layer: the norm applied to the attention output
    uniform_window: bool = False  # config.sliding_window applies to every layer
    refuse: Callable[[Any], str | None] | None = None  # config → why this model cannot be read (None: it can)

    def class_attributes(self) -> dict:
        """The class attributes of the adapter class built from this layout."""
        names = (
            "family",
            "model_types",
            "layers_name",
            "final_norm_name",
            "attention_name",
            "output_name",
            "output_is_conv1d",
            "value_name",
            "value_layout",
            "post_norm_name",
            "uniform_window",
        )
        out = {name: getattr(self, name) for name in names}
        out["post_attention_norm"] = self.post_norm_name is not None
        out["__doc__"] = self.doc
        if self.refuse is not None:
            out["refuse"] = staticmethod(self.refuse)
        return out


def rotary_fields(c, *, qk_norm: bool = False, grouped: bool = False) -> dict:
    """``HookedTransformerConfig`` fields of a Llama-like model (RMSNorm, gated MLP, rotary) from
    its HF config ``c``, as TransformerLens 2.18's ``convert_hf_model_config`` maps them, with the
    values it leaves out read from ``c`` (Llama's rotary base, the sliding windows of Qwen2 and
    Phi-3). ``grouped``: n_key_value_heads is set even when it equals n_heads (TransformerLens
    does so for Mistral, Qwen2 and Gemma)."""
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    grouped = grouped or c.num_key_value_heads != c.num_attention_heads
    fields = dict(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        n_key_value_heads=c.num_key_value_heads if grouped else None,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=getattr(c, "hidden_activation", None) or c.hidden_act,
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_adjacent_pairs=False,
        rotary_base=c.rope_theta,
        use_qk_norm=qk_norm,
    )
    window, types = getattr(c, "sliding_window", None), getattr(c, "layer_types", None)
    if window is not None and (types is None or "sliding_attention" in types):
        types = types or ["sliding_attention"] * c.num_hidden_layers
        fields.update(
            use_local_attn=True,
            window_size=window,
            attn_types=["local" if t == "sliding_attention" else "global" for t in types],
        )
    return fields
