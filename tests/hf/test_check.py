"""The load-time attention check of the HF-native backend (geolens.hf.check): an edited attention
module is refused naming the family and the layer (and no analysis runs on it), an attention that
bypasses transformers' interface is refused, the unedited model passes."""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.hf import AttentionCheckError, check_attention, prepare
from geolens.hf.check import check_tokens
from geolens.hf.tiny import tiny_family
from hf.conftest import attention_modules, hf_tokens


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_an_edited_attention_module_is_refused_naming_family_and_layer(family):
    model = tiny_family(family)
    attn = attention_modules(model)[1]
    original = attn.forward

    def shifted(*args, **kwargs):
        out, weights = original(*args, **kwargs)
        return out + 0.01, weights

    attn.forward = shifted
    with pytest.raises(
        AttentionCheckError, match=rf"hf-{family.replace('_', '-')}: layer 1: the attention output rebuilt"
    ):
        prepare(model)
    with pytest.raises(AttentionCheckError, match="layer 1"):  # no analysis runs on it either
        geolens.run_with_cache(model, hf_tokens())
    del attn.forward
    assert check_attention(model) <= 1.0  # the unedited module passes


def test_attention_that_bypasses_the_interface_is_refused():
    """A layer whose attention never reaches transformers' attention interface: no pattern."""
    model = tiny_family("llama")
    attn = attention_modules(model)[0]
    o_proj = attn.o_proj

    def plain(hidden_states, *args, **kwargs):  # a hand-written attention: no interface call
        return o_proj(torch.zeros(*hidden_states.shape[:-1], o_proj.in_features)), None

    attn.forward = plain
    with pytest.raises(AttentionCheckError, match="layer 0: its attention did not go through"):
        prepare(model)


def test_check_tokens_are_seeded_and_capped_at_the_context():
    model = tiny_family("llama", n_ctx=16)
    t = check_tokens(model)
    assert tuple(t.shape) == (2, 16) and int(t.min()) >= 0 and int(t.max()) < 64  # n_pos 24 capped at 16
    assert torch.equal(t, check_tokens(model)) and not torch.equal(t, check_tokens(model, seed=1))
    assert tuple(check_tokens(model, n_pos=5, batch=3).shape) == (3, 5)
