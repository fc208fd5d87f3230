"""The tiny random models of geolens.testing: the character tokenizer, tiny_tokens, seeded HF models
of each kind with non-zero biases, unknown kinds refused, and both backends agreeing on the same
weights (load_model('tiny-…', backend='hf') against the bridge)."""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.contributions import contribution_weight_pair
from geolens.testing import tiny_tokens


@pytest.mark.bridge_only
@pytest.mark.parametrize("kind", ["gqa", "mha", "gemma"])
def test_tiny_models_agree_with_the_bridge(kind):
    """load_model("tiny-…", backend="hf") and the bridge over the same HF weights: same cache
    quantities, contribution weights, baselines, sinks and Value Zeroing."""
    from geolens.models import load_model

    hf, bridge = load_model(f"tiny-{kind}", backend="hf"), load_model(f"tiny-{kind}")
    tokens = tiny_tokens(bridge, length=12)  # longer than the tiny sliding window (8)
    results = []
    for model in (hf, bridge):
        with torch.no_grad():
            _, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))
        m = geolens.attention_metrics(model, cache, 1)
        results.append(
            dict(
                contributions=contribution_weight_pair(model, cache, None),
                **m.as_dict(),
                vz=geolens.value_zeroing(model, tokens, layers=[0, 1]),
                sinks=geolens.sink_geometry(model, tokens, batch_size=2).heads,
            )
        )
    a, b = results
    for key in (*geolens.factors.AttentionMetrics.METRIC_NAMES, "vz"):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5, msg=key)
    torch.testing.assert_close(a["contributions"].intra, b["contributions"].intra, rtol=0, atol=1e-5)
    torch.testing.assert_close(a["contributions"].inter, b["contributions"].inter, rtol=0, atol=1e-5)
    import pandas as pd

    pd.testing.assert_frame_equal(a["sinks"], b["sinks"], check_exact=False, atol=1e-5, rtol=0)


def test_the_character_tokenizer_and_tiny_tokens():
    from geolens.testing import VOCAB_SIZE, tiny_hf_model, tiny_tokenizer

    tok = tiny_tokenizer()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    ids = tok("Ab 1", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["a", "b", " ", "1"] and max(ids) < VOCAB_SIZE  # lower-cased
    model = tiny_hf_model("gqa")
    t = tiny_tokens(model, ("the cat", "a dog ran far"), length=6)
    assert tuple(t.shape) == (2, 6) and bool((t[:, 0] == 0).all())
    assert t[0, 1:].tolist() == tok("the c", add_special_tokens=False)["input_ids"]


def test_tiny_hf_models_are_seeded_kinds_with_non_zero_biases():
    from geolens.testing import tiny_hf_model

    a, b = tiny_hf_model("mha"), tiny_hf_model("mha")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    biases = [p for n, p in a.named_parameters() if n.endswith("bias")]
    assert biases and all(bool((p != 0).any()) for p in biases)
    assert tiny_hf_model("gemma").config.model_type.startswith("gemma3")
    with pytest.raises(ValueError, match="unknown tiny model kind 'bert'"):
        tiny_hf_model("bert")
