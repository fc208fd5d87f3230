"""A padded batch on GPT-2 (absolute positions) equals its prompts run alone, on every backend
that hosts it: the HF-native backend (both environments), TransformerLens 4.x's
``TransformerBridge`` (main environment) and TransformerLens 2.x's ``HookedTransformer``
(``.venvs/tl2``), all on the same tiny random GPT-2 weights.

The models and the comparison are the support matrix's own (tests/support_checks.py: ``build``,
which converts the HF GPT-2 to a ``HookedTransformer`` with TransformerLens' ``convert_gpt2_weights``,
and the ``padding`` check: a left- and a right-padded batch, logits at the real positions and every
layer's contribution weights against the prompt run alone). Here they run in the fast tier on each
backend of the environment, and the check is shown to fail when a left-padded row's positions are
counted from the first column instead of its first real token.
"""

from __future__ import annotations

import pytest
import torch
from conftest import HAS_BRIDGE, HAS_HOOKED

import geolens
from geolens.hf.tiny import tiny_family

BACKENDS = ["hf", "tl4-bridge", "tl2-hooked"]


@pytest.fixture(scope="module")
def sm():
    import support_checks

    return support_checks


def build(sm, backend: str):
    if backend == "tl4-bridge" and not HAS_BRIDGE:
        pytest.skip("needs TransformerLens 4.x TransformerBridge")
    if backend == "tl2-hooked" and not HAS_HOOKED:
        pytest.skip("needs TransformerLens 2.x HookedTransformer (.venvs/tl2)")
    return sm.build("gpt2", backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_runs_the_same_gpt2(sm, backend):
    """The model under test is the HF GPT-2 itself: the same logits on an unpadded batch."""
    model, tokens = build(sm, backend), sm._tokens()
    with torch.no_grad():
        reference = tiny_family("gpt2")(tokens).logits
        logits, _ = geolens.run_with_cache(model, tokens)
    torch.testing.assert_close(logits, reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_padded_gpt2_batch_equals_its_prompts_alone(sm, backend):
    sm.check_padding(build(sm, backend))  # raises sm.Failed naming the side and the quantity


def test_the_check_fails_when_left_padding_shifts_the_positions(sm, monkeypatch):
    """GPT-2's logits depend on absolute positions, so a left-padded row whose positions start at
    the first column (padding counted) no longer equals the prompt alone, and the check says so."""
    import geolens.hf.backend as backend

    model = sm.build("gpt2", "hf")
    tokens = sm._tokens(1, 8, seed=1)
    with torch.no_grad():
        alone = model(tokens).logits
        shifted = model(tokens, position_ids=torch.arange(4, 12)[None]).logits
    assert float((alone - shifted).abs().max()) > 1e-2
    monkeypatch.setattr(backend, "_positions", lambda mask: torch.arange(mask.shape[1]).expand_as(mask))
    with pytest.raises(sm.Failed, match="left-padded row: logits"):
        sm.check_padding(model)
