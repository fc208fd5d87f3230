"""Tiny random Hugging Face models of every family (geolens.hf.tiny): the shapes the module docstring
promises (2 layers, d_model 32, 4 query heads of 8, a 64-token vocabulary, 128 positions), their
family's ``config.model_type``, seeded weights with non-zero biases where the family has them, and
an unknown family refused."""

from __future__ import annotations

import pytest
import torch

from geolens.families import family
from geolens.hf.tiny import FAMILIES, WINDOW, tiny_family


def _shape(model) -> tuple:
    c = model.config
    n_heads = getattr(c, "num_attention_heads", None) or c.n_head
    d_model = getattr(c, "hidden_size", None) or c.n_embd
    n_layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    return n_layers, d_model, n_heads, c.vocab_size


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_has_the_promised_shape_and_model_type(name):
    model = tiny_family(name)
    assert _shape(model) == (2, 32, 4, 64)
    assert model.config.model_type in family(name).HF.model_types
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.architectures == [type(model).__name__]
    assert _shape(tiny_family(name, n_layers=3))[0] == 3


def test_weights_are_seeded_and_biases_are_not_zero():
    a, b, c = tiny_family("gpt2"), tiny_family("gpt2"), tiny_family("gpt2", seed=1)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), name
    assert any(not torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))
    biases = [p for n, p in a.named_parameters() if n.endswith("bias")]
    assert biases and all(bool((p != 0).any()) for p in biases)


def test_the_sliding_windows_of_the_families_that_have_them():
    assert tiny_family("mistral").config.sliding_window == WINDOW == 8
    assert tiny_family("gemma2").config.layer_types == ["sliding_attention", "full_attention"]
    assert tiny_family("qwen2").config.layer_types == ["full_attention", "sliding_attention"]


def test_an_unknown_family_is_refused():
    with pytest.raises(ValueError, match="unknown family 'bert'"):
        tiny_family("bert")
