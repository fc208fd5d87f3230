"""Float64-exact per-term effects on a TransformerLens 4.x bridge (geolens.per_term.exact): in float64
the fast path equals the naive path within its numerical floor, that floor drops by orders of
magnitude, and the model's own softmax and norms are back afterwards."""

from __future__ import annotations

import contextlib

import pytest
import torch

from geolens.per_term import float64_exact, per_term_effects
from geolens.testing import tiny_bridge, tiny_tokens

pytestmark = pytest.mark.bridge_only  # float64_exact is about the TL 4.x bridge's softmax; built on tiny bridges


@pytest.mark.parametrize("kind", ["gqa", "gemma"])
def test_float64_effects_equal_the_naive_float64_path(kind):
    model = tiny_bridge(kind).to(torch.float64)
    tokens = tiny_tokens(model, length=12)[:1]
    with float64_exact(model):
        fast = per_term_effects(model, tokens, layer=1, query=9)
        naive = per_term_effects(model, tokens, layer=1, query=9, method="naive")
    assert fast.kl.dtype == torch.float64 and fast.floor is not None
    assert float((fast.kl - naive.kl).abs().max()) <= max(10 * fast.floor, 1e-15)
    assert torch.allclose(fast.delta_p, naive.delta_p, rtol=0, atol=1e-14)
    # outside the block the model's float32 softmax and norms are back (the patches are removed)
    assert not any("_masked_softmax" in vars(m) for m in model.modules())


def test_float64_exact_computes_the_pattern_in_float64_and_resolves_effects_to_1e_13():
    """Outside the block the bridge's softmax rounds α to float32 (4e-8 here), inside it α is the
    float64 softmax of the scores, and the floor of the effects is below 1e-13. Whether the float32
    α also shows in the floor outside the block depends on the CPU: it does where the batched and
    the clean forward round differently (1e-8 on the CI machine), not on an AMD EPYC without
    AVX-512 (9e-16), so only the pattern is asserted there."""
    model = tiny_bridge("gqa").to(torch.float64)
    tokens = tiny_tokens(model, length=12)[:1]
    names = ("blocks.1.attn.hook_pattern", "blocks.1.attn.hook_attn_scores")
    errors = []
    for exact in (False, True):
        with float64_exact(model) if exact else contextlib.nullcontext(), torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
        reference = torch.softmax(cache[names[1]].to(torch.float64), -1)
        errors.append(float((cache[names[0]] - reference).abs().max()))
    assert errors[1] < 1e-15 and errors[0] > 1e-10  # float64 inside, float32 rounding outside
    with float64_exact(model):
        effects = per_term_effects(model, tokens, layer=1, query=-1)
    assert effects.floor < 1e-13


def test_float64_exact_on_the_hf_native_backend_keeps_its_softmax_in_float64():
    """Hugging Face's eager attention asks softmax for float32: within the block a float64 input
    stays float64, so the HF-native model's logits equal the float64-exact bridge's on the same
    weights (outside it they differ at float32 rounding), and the function is restored after."""
    import geolens

    hf = geolens.load_model("tiny-gqa", backend="hf").to(torch.float64)
    bridge = geolens.load_model("tiny-gqa").to(torch.float64)
    tokens = tiny_tokens(bridge, length=12)[:1]
    before = torch.nn.functional.softmax
    with torch.no_grad():
        with float64_exact(bridge):
            reference = bridge(tokens)
        loose = hf(tokens).logits
        with float64_exact(hf):
            assert torch.nn.functional.softmax is not before
            exact = hf(tokens).logits
    assert torch.nn.functional.softmax is before
    assert float((exact - reference).abs().max()) < 1e-12 < float((loose - reference).abs().max())
    x = torch.randn(3, 5, dtype=torch.float64)
    assert torch.nn.functional.softmax(x, -1, dtype=torch.float32).dtype == torch.float32
