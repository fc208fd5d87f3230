"""per_term_effects (geolens.per_term.effects): the exact effect of removing one attention term,
against hand-built removals.

The oracle is independent of both code paths: a full forward with a hook on the pre-norm attention
output (``attn_out_hook``) that subtracts α_ij^h ṽ_j^h, materialised in float64 as v_j^h W_O^h
(tests/reference.py's layout), at position i; KL and Δp by hand in float64. The fast path edits
``hook_z`` over a KV cache, the naive path zeroes α in ``hook_pattern``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny

from geolens.adapter import adapter_for, get_attention_layer, output_weights
from geolens.interventions.base import active_hook_count, applied
from geolens.per_term import _clean_state, _z_removal, per_term_effects
from geolens.testing import tiny_tokens
from per_term.conftest import N_POS


def hand_removed_logits(model, tokens, layer, query, terms) -> torch.Tensor:
    """Logits at ``query`` of a full forward whose pre-norm attention output at (layer, query)
    loses Σ α_ij^h v_j^h W_O^h over ``terms`` [(head, source)], materialised in float64."""
    layer %= model.cfg.n_layers
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_v")))
    view = get_attention_layer(model, cache, layer, dtype=torch.float64)
    W_O = output_weights(model, layer)[0].detach().to(torch.float64)
    removed = torch.zeros(model.cfg.d_model, dtype=torch.float64)
    for h, j in terms:
        removed += view.pattern[0, h, query, j] * (view.v[0, j, h] @ W_O[h])

    def hook(out, hook):
        out = out.clone()
        out[0, query] -= removed.to(out.dtype)
        return out

    with torch.no_grad(), applied(model, [(adapter_for(model).attn_out_hook(layer), hook)]):
        return model(tokens)[0, query]


def kl_and_delta_p(clean: torch.Tensor, perturbed: torch.Tensor) -> tuple[float, float]:
    p = torch.softmax(clean.double(), -1)
    q = torch.softmax(perturbed.double(), -1)
    top = int(p.argmax())
    kl = sum(float(p[t]) * (float(p[t].log()) - float(q[t].log())) for t in range(p.numel()))
    return kl, float(q[top] - p[top])


def close(a, b, scale):
    """Equal to float32 rounding of the logits: KL and Δp move by ~1e-7 of their scale."""
    assert abs(a - b) <= 1e-3 * abs(scale) + 1e-9, (a, b, scale)


CASES = [  # (layer, query, head, source): the sink, the current token, query 0, the last layer
    (0, 23, 0, 0),
    (0, 23, 1, 23),
    (1, 23, 3, 20),
    (-1, 10, 2, 0),
    (1, 0, 1, 0),
    (0, 5, 3, 2),
]


@pytest.mark.parametrize("layer, query, head, source", CASES)
def test_one_term_equals_a_hand_built_removal(text, layer, query, head, source):
    model, tokens = text
    effects = per_term_effects(model, tokens, layer, query, batch_size=5)
    with torch.no_grad():
        clean = model(tokens)[0, query]
    kl, dp = kl_and_delta_p(clean, hand_removed_logits(model, tokens, layer, query, [(head, source)]))
    assert effects.kl.shape == (model.cfg.n_heads, query + 1)
    assert effects.clean_token == int(clean.argmax())
    assert effects.clean_prob == pytest.approx(float(torch.softmax(clean.double(), -1).max()), rel=1e-5)
    if not effects.ran[head, source]:  # outside the tiny Gemma's window: α = 0, nothing to remove
        assert kl == pytest.approx(0, abs=1e-12) and effects.kl[head, source] == 0
        return
    close(float(effects.kl[head, source]), kl, effects.kl.max())
    close(float(effects.delta_p[head, source]), dp, effects.delta_p.abs().max())
    assert kl > 0


@pytest.mark.parametrize("layer, query", [(0, 23), (1, 7)])
def test_source_scope_equals_the_removal_summed_over_heads(text, layer, query):
    model, tokens = text
    effects = per_term_effects(model, tokens, layer, query, scope="source", batch_size=4)
    assert effects.kl.shape == effects.delta_p.shape == (query + 1,)
    with torch.no_grad():
        clean = model(tokens)[0, query]
    for j in (0, query // 2, query):
        kl, dp = kl_and_delta_p(
            clean, hand_removed_logits(model, tokens, layer, query, [(h, j) for h in range(model.cfg.n_heads)])
        )
        close(float(effects.kl[j]), kl, effects.kl.max())
        close(float(effects.delta_p[j]), dp, effects.delta_p.abs().max())


def test_removing_every_term_removes_the_whole_attention_output(text):
    """Σ_h Σ_j α_ij^h ṽ_j^h is the attention output less b_O: the fast path's z-edit removing every
    source leaves b_O alone, as a hand-built forward that sets the output at i to b_O does."""
    model, tokens = text
    layer, query = 1, 15
    adapter = adapter_for(model)
    with torch.no_grad():
        clean = _clean_state(model, tokens, layer, query)
        every = _z_removal(clean, [(-1, j) for j in range(query + 1)])[1:].sum(0, keepdim=True)
        delta = torch.cat([torch.zeros_like(every), every])

        def edit(z, hook):
            return (z.reshape(2, -1) - delta.reshape(2, -1).to(z.dtype)).reshape(z.shape)

        prefix = adapter_for(model).prefix_kv_cache(tokens[:, :query])
        with applied(model, [(adapter.z_hook(layer), edit)]):
            fast = adapter_for(model).single_position_logits(clean.resid_pre.expand(2, -1), layer, query, prefix)
        b_O = output_weights(model, layer)[1].detach()

        def only_bias(out, hook):
            out = out.clone()
            out[0, query] = b_O.to(out.dtype)
            return out

        with applied(model, [(adapter.attn_out_hook(layer), only_bias)]):
            whole = model(tokens)[0, query]
        every_term = hand_removed_logits(
            model, tokens, layer, query, [(h, j) for h in range(model.cfg.n_heads) for j in range(query + 1)]
        )
    torch.testing.assert_close(fast[0], clean.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast[1], whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(every_term, whole, atol=1e-5, rtol=1e-5)
    assert (whole - clean.logits).abs().max() > 1e-3  # the removal does something


@pytest.mark.bridge_only
def test_terms_outside_a_sliding_window_have_zero_effect_without_running():
    model = make_tiny("gemma")
    tokens = tiny_tokens(model, length=N_POS)[:1]
    effects = per_term_effects(model, tokens, 0, 23)  # layer 0 slides over 16 tokens
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_v")))
    alpha = get_attention_layer(model, cache, 0).pattern[0, :, 23]
    assert (alpha[:, :8] == 0).all() and (alpha[:, 8:] > 0).all()
    assert not effects.ran[:, :8].any() and effects.ran[:, 8:].all()
    assert (effects.kl[:, :8] == 0).all() and (effects.delta_p[:, :8] == 0).all()
    assert (effects.kl[:, 8:] > 0).all()
    with torch.no_grad():
        clean = model(tokens)[0, 23]
    assert kl_and_delta_p(clean, hand_removed_logits(model, tokens, 0, 23, [(1, 3)]))[0] == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("scope", ["term", "source"])
def test_fast_path_equals_naive_path_for_every_term(text, scope):
    model, tokens = text
    for layer, query in [(0, N_POS - 1), (1, N_POS - 1), (1, 0), (0, 9)]:
        fast = per_term_effects(model, tokens, layer, query, scope=scope, batch_size=16)
        naive = per_term_effects(model, tokens, layer, query, scope=scope, batch_size=3, method="naive")
        assert fast.method == "fast" and naive.method == "naive"
        assert torch.equal(fast.ran, naive.ran) and fast.clean_token == naive.clean_token
        torch.testing.assert_close(fast.kl, naive.kl, atol=1e-3 * float(naive.kl.max()) + 1e-10, rtol=0)
        torch.testing.assert_close(
            fast.delta_p, naive.delta_p, atol=1e-3 * float(naive.delta_p.abs().max()) + 1e-9, rtol=0
        )
        assert (fast.kl >= -1e-12).all()


def test_batch_size_and_outcomes_do_not_change_the_numbers(text):
    model, tokens = text
    one = per_term_effects(model, tokens, 1, 12, batch_size=1, outcome="kl")
    many = per_term_effects(model, tokens, 1, 12, batch_size=1000)
    assert one.delta_p is None
    torch.testing.assert_close(one.kl, many.kl, atol=1e-3 * float(many.kl.max()) + 1e-12, rtol=0)
    negative = per_term_effects(model, tokens, -1, -1, outcome=("delta_p",))
    assert negative.layer == model.cfg.n_layers - 1 and negative.query == N_POS - 1 and negative.kl is None


def test_hooks_are_removed(text):
    model, tokens = text
    before = active_hook_count(model)
    per_term_effects(model, tokens, 0, 6)
    per_term_effects(model, tokens, 0, 3, scope="source", method="naive")
    assert active_hook_count(model) == before


@pytest.mark.parametrize("method", ["fast", "naive"])
def test_a_subset_of_terms(text, method):
    model, tokens = text
    every = per_term_effects(model, tokens, 1, 9)
    some = per_term_effects(model, tokens, 1, 9, terms=[(0, 0), (2, 5)], method=method)
    assert some.method == method
    assert some.ran.sum() == 2 and some.ran[0, 0] and some.ran[2, 5] and some.kl[1].abs().sum() == 0
    torch.testing.assert_close(some.kl[some.ran], every.kl[some.ran], atol=1e-3 * float(every.kl.max()) + 1e-10, rtol=0)
    sources = per_term_effects(model, tokens, 1, 9, scope="source", terms=[4], method=method)
    assert sources.ran.sum() == 1 and sources.ran[4] and sources.kl[:4].abs().sum() == 0


@pytest.mark.parametrize("kind", ["mha", "gqa"])
def test_a_pad_token_in_the_text_is_an_ordinary_token(kind):
    """A text holding the tokenizer's pad token just before the query (GPT-2: pad = BOS = EOS): the
    KV cache of the prefix must not mask it (TransformerLens 2.x derives such a mask when given none)."""
    model = make_tiny(kind)
    tokens = tiny_tokens(model, length=12)[:1].clone()
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    tokens[0, 9] = pad
    fast = per_term_effects(model, tokens, 0, 10, scope="source")
    naive = per_term_effects(model, tokens, 0, 10, scope="source", method="naive")
    torch.testing.assert_close(fast.kl, naive.kl, rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# position_effects: both scopes and the gradient from one clean run and one prefix KV cache


def test_crop_kv_cache_equals_a_cache_of_the_prefix(text):
    model, tokens = text
    adapter = adapter_for(model)
    with torch.no_grad():
        whole = adapter.prefix_kv_cache(tokens)
        resid = torch.randn(3, model.cfg.d_model)
        for query in (1, 9, 23):
            a = adapter.single_position_logits(resid, 1, query, adapter.crop_kv_cache(whole, query))
            b = adapter.single_position_logits(resid, 1, query, adapter.prefix_kv_cache(tokens[:, :query]))
            assert torch.allclose(a, b, atol=1e-5)
    assert adapter.crop_kv_cache(whole, 0) is None
