"""A TransformerLens 2.x HookedTransformer converted from an in-memory HF model
(geolens.families.convert): the seeded comparison tokens, the converted model's logits and weights
against the HF model's, and the refusals (a family TransformerLens 2.x cannot hold; a conversion
whose logits differ). The conversion needs TransformerLens 2.x (.venvs/tl2)."""

from __future__ import annotations

import pytest
import support_checks
import torch

import geolens.families.convert as convert
from geolens.families.convert import N_POS, comparison_tokens, hooked_from_hf
from geolens.hf.tiny import tiny_family

needs_tl2 = pytest.mark.skipif(
    "tl2-hooked" not in support_checks.available_backends(),
    reason="needs TransformerLens 2.x HookedTransformer (.venvs/tl2)",
)


def test_comparison_tokens_are_seeded_bos_first_ids_in_range():
    t = comparison_tokens()
    assert tuple(t.shape) == (2, N_POS) and t.dtype == torch.int64
    assert bool((t[:, 0] == 0).all()) and bool(((t[:, 1:] >= 4) & (t[:, 1:] < 64)).all())
    assert torch.equal(t, comparison_tokens()) and not torch.equal(t, comparison_tokens(seed=1))
    assert tuple(comparison_tokens(3, 20).shape) == (3, 20)


@needs_tl2
def test_the_converted_model_gives_the_hf_models_logits_and_weights():
    hf = tiny_family("llama")
    model = hooked_from_hf(hf)
    tokens = comparison_tokens(n_rows=3, seed=5)  # not the batch the conversion checked itself on
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=0, atol=1e-5)
    attn = hf.model.layers[1].self_attn
    n_heads, d_head = model.cfg.n_heads, model.cfg.d_head
    w_o = attn.o_proj.weight.T.reshape(n_heads, d_head, -1)  # [head, d_head, d_model]
    torch.testing.assert_close(model.blocks[1].attn.W_O.detach(), w_o.detach(), rtol=0, atol=0)


@needs_tl2
def test_a_family_transformer_lens_2_cannot_hold_is_refused():
    with pytest.raises(NotImplementedError, match="no OLMo 2 conversion"):
        hooked_from_hf(tiny_family("olmo2"))


@needs_tl2
def test_a_conversion_with_other_logits_is_refused(monkeypatch):
    exact = convert.hooked_config

    def wrong_rotary_base(config):
        fields, converter = exact(config)
        return {**fields, "rotary_base": 10 * fields["rotary_base"]}, converter

    monkeypatch.setattr(convert, "hooked_config", wrong_rotary_base)
    with pytest.raises(ValueError, match="gives other logits than the HF model"):
        hooked_from_hf(tiny_family("llama"))
