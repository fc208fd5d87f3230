"""One position's per-term effects and gradient (geolens.per_term.position): from a shared run equal to
the separate calls, and gradient × activation equal to autograd through a full forward, leaving no
hook behind."""

from __future__ import annotations

import pytest
import torch

from geolens.adapter import adapter_for, get_attention_layer, output_weights
from geolens.interventions.base import active_hook_count, applied
from geolens.per_term import per_term_effects


@pytest.mark.parametrize("layer, query", [(0, 23), (1, 9)])
def test_position_effects_from_a_shared_run_equal_the_separate_calls(text, layer, query):
    from geolens.per_term import position_effects

    model, tokens = text
    adapter = adapter_for(model)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        kv = adapter.prefix_kv_cache(tokens)
    shared = position_effects(model, tokens, layer, query, clean_run=(logits, cache), kv_cache=kv)
    alone = position_effects(model, tokens, layer, query)
    for scope in ("term", "source"):
        reference = per_term_effects(model, tokens, layer, query, scope=scope)
        for got in (getattr(shared, scope), getattr(alone, scope)):
            assert torch.allclose(got.kl, reference.kl, atol=1e-7, rtol=1e-4)
            assert torch.allclose(got.delta_p, reference.delta_p, atol=1e-7, rtol=1e-4)
            assert torch.equal(got.ran, reference.ran)
    assert torch.allclose(shared.grad_z, alone.grad_z, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("layer, query", [(0, 23), (1, 9)])
def test_gradient_x_activation_equals_autograd_through_a_full_forward(text, layer, query):
    """The oracle: autograd of log p(top) at ``query`` through a full forward from layer 0, with
    respect to a probe added to the pre-norm attention output at (layer, query); the estimate of
    removing term (h, j) is then −⟨grad, α v_j^h W_O^h⟩, W_O materialised in float64."""
    from geolens.per_term import position_effects

    model, tokens = text
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_v")))
    view = get_attention_layer(model, cache, layer, dtype=torch.float64)
    W_O = output_weights(model, layer)[0].detach().to(torch.float64)
    probe = torch.zeros(model.cfg.d_model, requires_grad=True)

    def hook(out, hook):
        out = out.clone()
        out[0, query] = out[0, query] + probe
        return out

    with torch.enable_grad(), applied(model, [(adapter_for(model).attn_out_hook(layer), hook)]):
        logits = model(tokens)[0, query]
        top = int(logits.argmax())
        (grad,) = torch.autograd.grad(torch.log_softmax(logits.double(), -1)[top], probe)
    n_heads = view.pattern.shape[1]
    expected = torch.zeros(n_heads, query + 1, dtype=torch.float64)
    for h in range(n_heads):
        for j in range(query + 1):
            expected[h, j] = -view.pattern[0, h, query, j] * float((view.v[0, j, h] @ W_O[h]) @ grad.double())
    before = active_hook_count(model)
    got = position_effects(model, tokens, layer, query).grad_x_act
    assert torch.allclose(got, expected, atol=1e-6 * float(expected.abs().max()) + 1e-9, rtol=1e-3)
    assert active_hook_count(model) == before
