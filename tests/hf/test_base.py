"""The HF-native adapter (geolens.hf.base): a model family geolens has no adapter for is one clear,
one-line error."""

from __future__ import annotations

import pytest

from geolens.hf import prepare


def test_a_family_without_an_adapter_is_one_clear_error():
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4))
    with pytest.raises(ValueError, match=r"bloom.*no geolens adapter") as err:
        prepare(model)
    assert "\n" not in str(err.value)
