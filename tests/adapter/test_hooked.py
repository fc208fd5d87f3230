"""Slow tier in the TransformerLens 2.x environment: SmolLM2 as a HookedTransformer.

Runs only where ``HookedTransformer`` exists and the converted SmolLM2 checkpoint is in the
geolens cache (the TL 4.x half of ``scripts/test.sh`` creates it first).
"""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.model_cache import MANIFEST, cache_dir

pytestmark = [pytest.mark.slow, pytest.mark.tl2_slow]
CHECKPOINT = cache_dir() / "models" / "smollm2-135m-f32"


@pytest.fixture(scope="module")
def hooked_smollm2():
    pytest.importorskip("transformer_lens.HookedTransformer", reason="needs TransformerLens 2.x/3.x")
    if not (CHECKPOINT / MANIFEST).exists():
        pytest.skip(f"no converted SmolLM2 checkpoint in {CHECKPOINT}; run the TL 4.x suite first")
    from geolens.models import hooked_llama_from_checkpoint

    return hooked_llama_from_checkpoint(str(CHECKPOINT))


def test_hooked_smollm2_matches_hf_logits(hooked_smollm2):
    model, hf = hooked_smollm2
    assert model.cfg.rotary_base == 1e5 and hf.config.rope_theta == 1e5  # not TL's silent 10000
    tokens = model.to_tokens("The capital of France is Paris.", prepend_bos=True)
    with torch.no_grad():
        ours = model(tokens).log_softmax(-1)
        ref = hf(tokens).logits.log_softmax(-1)
    assert (ours - ref).abs().max() < 1e-3


def test_contributions_on_hooked_smollm2(hooked_smollm2):
    model, _ = hooked_smollm2
    assert geolens.adapter.model_mode(model) == "hooked"
    tokens = model.to_tokens("The capital of France is Paris. It is a large city.", prepend_bos=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model, with_attn_out=True))
    for layer in (0, 15, 29):
        view = geolens.get_attention_layer(model, cache, layer)
        out = geolens.layer_output(view) + view.b_O
        torch.testing.assert_close(out, cache[f"blocks.{layer}.hook_attn_out"], atol=1e-4, rtol=1e-4)
        intra = geolens.contribution_weights(model, cache, layer, "intra")
        torch.testing.assert_close(intra.sum(-1), torch.ones_like(intra.sum(-1)), atol=1e-5, rtol=0)
        inter = geolens.per_source_totals(geolens.contribution_weights(model, cache, layer, "inter"))
        torch.testing.assert_close(inter.sum(-1), torch.ones_like(inter.sum(-1)), atol=1e-5, rtol=0)
