"""Masked outcomes (geolens.faithfulness.masked_outcomes): starting the masked forward at the masked
layer equals recomputing from layer 0 (tiny models and SmolLM2), and a wrong clean reference is
refused with no hook left behind."""

from __future__ import annotations

import json

import pytest
import torch

from faithfulness.conftest import N_POS, TWIN
from geolens.adapter import adapter_for, get_attention_layer, names_filter
from geolens.faithfulness.layer_masking import (
    masked_outcomes,
    masking_scores,
    query_masks,
    scored_positions,
)
from geolens.interventions.base import active_hook_count


def test_start_at_layer_equals_recomputing_from_layer_zero(document):
    model, tokens, protocol, _, rows, logits, cache = document
    positions = scored_positions(protocol)
    adapter = adapter_for(model)
    g = torch.Generator().manual_seed(3)
    before = active_hook_count(model)
    for layer in sorted(set(rows.layer)):
        terms = get_attention_layer(model, cache, layer).pattern[0] != 0
        masks = torch.stack(query_masks(torch.rand(terms.shape, generator=g), terms, [0.05, 0.2, 0.5]) + [terms])
        fast = masked_outcomes(
            model,
            tokens,
            layer,
            masks,
            positions,
            logits[0, positions],
            resid_pre=cache[adapter.resid_pre_hook(layer)],
            batch_size=3,
        )
        slow = masked_outcomes(model, tokens, layer, masks, positions, logits[0, positions], batch_size=2)
        for key in ("kl", "delta_p", "nll"):
            torch.testing.assert_close(fast[key], slow[key], rtol=1e-5, atol=1e-7)
        assert (fast["kl"][-1] > 0).all()
    assert active_hook_count(model) == before


def test_a_wrong_clean_reference_raises_and_leaves_no_hook(document):
    model, tokens, protocol, _, rows, logits, cache = document
    positions = scored_positions(protocol)
    layer = int(rows.layer.iloc[0])
    masks = torch.ones(1, model.cfg.n_heads, N_POS, N_POS, dtype=torch.bool).tril()
    before = active_hook_count(model)
    with pytest.raises(RuntimeError, match="differs from the clean forward"):
        masked_outcomes(
            model,
            tokens,
            layer,
            masks,
            positions,
            logits[0, positions] + 1.0,
            resid_pre=cache[adapter_for(model).resid_pre_hook(layer)],
        )
    assert active_hook_count(model) == before


@pytest.mark.slow
def test_smollm2_start_at_layer_equals_from_layer_zero(smollm2):
    """On the real model (GQA, bridge): a few masked conditions of two layers, both ways."""
    from geolens.data import corpus_windows

    model = smollm2
    tokens = corpus_windows(model, "lee", 128, 1)
    positions = scored_positions(json.loads(TWIN.read_text()))
    adapter = adapter_for(model)
    layers = [3, 25]
    wanted = names_filter(model, layers)
    with torch.no_grad():
        logits, cache = model.run_with_cache(
            tokens, names_filter=lambda n: wanted(n) or n in {adapter.resid_pre_hook(l) for l in layers}
        )
    for layer in layers:
        view = get_attention_layer(model, cache, layer)
        terms = view.pattern[0] != 0
        scores = masking_scores(view, ["contribution"])["contribution"]
        masks = torch.stack(query_masks(scores, terms, [0.02, 0.2]) + [terms])
        fast = masked_outcomes(
            model, tokens, layer, masks, positions, logits[0, positions], resid_pre=cache[adapter.resid_pre_hook(layer)]
        )
        slow = masked_outcomes(model, tokens, layer, masks, positions, logits[0, positions])
        # float32 rounding: the earlier blocks run on a batch of 1 (the cache) or of n rows
        for key in ("kl", "delta_p", "nll"):
            torch.testing.assert_close(fast[key], slow[key], rtol=1e-3, atol=2e-5, msg=key)
        assert (fast["kl"].mean(1) > 1e-3).all()
