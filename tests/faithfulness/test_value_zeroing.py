"""Value Zeroing (geolens.faithfulness.value_zeroing, docs/method.md §3) against a naive rerun per
zeroed source (tests/reference.py), on some queries, after ln_final, in bfloat16 and on SmolLM2, and
its refusal of a block it cannot rebuild."""

from __future__ import annotations

import pytest
import torch
from reference import naive_value_zeroing

from geolens.faithfulness import (
    value_zeroing,
)
from geolens.interventions import active_hook_count


def test_value_zeroing_matches_naive_rerun(tiny):
    model, tokens, _ = tiny
    layers = list(range(model.cfg.n_layers))
    before = active_hook_count(model)
    got = value_zeroing(model, tokens, layers)
    chunked = value_zeroing(model, tokens, layers, chunk_size=5)
    assert got.shape == (len(layers), tokens.shape[0], tokens.shape[1], tokens.shape[1])
    assert active_hook_count(model) == before
    assert torch.allclose(got, chunked, atol=1e-6)
    for n, l in enumerate(layers):
        want = naive_value_zeroing(model, tokens, l)
        assert torch.allclose(got[n].double(), want, atol=2e-5), (l, (got[n].double() - want).abs().max())
    assert (got.triu(1) == 0).all()  # future sources never matter
    assert got.max() > 0


def test_value_zeroing_on_some_queries_equals_those_rows_of_the_full_scores(tiny):
    from geolens.testing import tiny_tokens

    model = tiny[0]
    tokens = tiny_tokens(model, length=14)[:1]
    full = value_zeroing(model, tokens, [0, 1])
    some = value_zeroing(model, tokens, [0, 1], queries={0: [3, 13], 1: [-1, 7]}, chunk_size=4)
    for n, rows in enumerate(([3, 13], [13, 7])):
        assert torch.allclose(some[n, :, rows], full[n, :, rows], atol=1e-6)
        others = [q for q in range(14) if q not in rows]
        assert bool((some[n, :, others] == 0).all())
    with pytest.raises(ValueError, match="layers"):
        value_zeroing(model, tokens, [0, 1], queries={0: [3]})


def test_value_zeroing_final_norm_scores_last_layer_after_ln_final(tiny):
    model, tokens, _ = tiny
    last = model.cfg.n_layers - 1
    # A HookedTransformer folds ln_final's gain into W_U (fold_ln): its ln_final only rescales,
    # which no cosine sees (a LayerNorm still centres). Elsewhere the gain is made non-uniform so that the norm matters.
    weights = [p for n, p in model.ln_final.named_parameters() if n.endswith("weight")]
    saved = [w.detach().clone() for w in weights]
    try:
        with torch.no_grad():  # a non-uniform gain, so that the norm changes the cosines
            for w in weights:
                w.mul_(torch.linspace(0.2, 3.0, w.numel()).reshape(w.shape))
        got = value_zeroing(model, tokens[:1, :10], [0, last], final_norm=True)
        plain = value_zeroing(model, tokens[:1, :10], [0, last])
        want = naive_value_zeroing(model, tokens[:1, :10], last, final_norm=True)
    finally:
        with torch.no_grad():
            for w, s in zip(weights, saved):
                w.copy_(s)
    assert torch.equal(got[0], plain[0])  # other layers unchanged
    assert torch.allclose(got[1].double(), want, atol=2e-5), (got[1].double() - want).abs().max()
    if weights:
        assert not torch.allclose(got[1], plain[1], atol=1e-4)  # the norm changes the scores


def test_value_zeroing_refuses_a_block_it_cannot_rebuild(tiny_gqa, monkeypatch):
    from geolens.adapter import adapter_for

    model, tokens, _ = tiny_gqa
    adapter = type(adapter_for(model))
    real = adapter.block_after_attention
    monkeypatch.setattr(adapter, "block_after_attention", lambda self, l, r, a: 2 * real(self, l, r, a))
    with pytest.raises(RuntimeError, match="not supported"):
        value_zeroing(model, tokens[:1, :8], [0])
    monkeypatch.undo()
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="chunk_size"):
            value_zeroing(model, tokens[:1, :8], [0], chunk_size=bad)


@pytest.mark.slow
def test_smollm2_value_zeroing_one_layer(smollm2, smollm2_tokens):
    seq = smollm2_tokens[:1, :16]
    got = value_zeroing(smollm2, seq, [12], chunk_size=8)[0]
    want = naive_value_zeroing(smollm2, seq, 12)
    assert torch.allclose(got.double(), want, atol=1e-4)


@pytest.mark.parametrize("kind", ["gqa", "gemma"])
def test_value_zeroing_runs_in_bfloat16(kind):
    """The rebuilt-block guard allows the model's own rounding: a bf16 model is scored, not refused,
    and its scores follow the float32 ones."""
    from conftest import HAS_BRIDGE, make_tiny

    if kind == "gemma" and not HAS_BRIDGE:
        pytest.skip("the tiny Gemma model needs TransformerBridge")
    model = make_tiny(kind)
    tokens = torch.randint(4, 40, (1, 10))
    tokens[:, 0] = 0
    want = value_zeroing(model, tokens, [0])
    model.to(torch.bfloat16)
    got = value_zeroing(model, tokens, [0])
    assert (got.triu(1) == 0).all()
    assert torch.allclose(got, want, atol=0.05), (got - want).abs().max()
    assert got.max() > 0
