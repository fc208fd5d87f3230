"""Sink-value interventions (docs/method.md §4): identities in the real forward pass, GQA groups, no leaks."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny

from geolens.adapter import attn_out_hook, has_post_attention_norm, hook_name, is_bridge
from geolens.interventions import active_hook_count, applied
from geolens.interventions.sink_values import (
    PartialKVGroupError,
    SinkEditSpec,
    affected_query_heads,
    kv_heads_of,
    mean_sink_value_applied,
    mean_sink_value_hooks,
    remove_sink_value_hooks,
    removed_sink_value,
    scale_sink_value,
    scale_sink_value_hooks,
    scaled_sink_value,
    sink_edit,
)
from geolens.testing import tiny_tokens


def _run(model, tokens, fwd_hooks=(), layer=0):
    """Logits, the edited layer's cached hook_v and pattern, and its pre-norm attention output."""
    names = [hook_name(layer, "attn.hook_v"), hook_name(layer, "attn.hook_pattern")]
    out_name = attn_out_hook(model, layer) if (is_bridge(model) or not has_post_attention_norm(model)) else None
    if out_name:
        names.append(out_name)
    with torch.no_grad(), applied(model, list(fwd_hooks)):
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return logits, cache[names[0]], cache[names[1]], (cache[out_name] if out_name else None)


def _expected_attn_out(model, pattern, v_kv, layer):
    """Σ_h Σ_j α_ij^h v_j^{kv(h)} W_O^h + b_O, float64 loops over heads (explicit GQA mapping)."""
    W_O = model.blocks[layer].attn.W_O.detach().double()
    n_heads = model.cfg.n_heads
    group = n_heads // v_kv.shape[2]
    out = 0
    for h in range(n_heads):
        vt = v_kv[:, :, h // group].double() @ W_O[h]  # [b, k, dm]
        out = out + torch.einsum("bqk,bkm->bqm", pattern[:, h].double(), vt)
    try:
        b_O = model.blocks[layer].attn.b_O
    except (AttributeError, TypeError):
        b_O = None
    return out + (b_O.detach().double() if b_O is not None else 0)


@pytest.fixture(scope="module", params=["gqa", "mha"])
def model_tokens(request):
    model = make_tiny(request.param)
    return model, tiny_tokens(model, length=12)


def test_lambda_one_changes_nothing(model_tokens):
    model, tokens = model_tokens
    base = _run(model, tokens)[0]
    edited = _run(model, tokens, scale_sink_value_hooks(model, 1.0))[0]
    assert torch.equal(base, edited)


def test_lambda_zero_equals_removal(model_tokens):
    model, tokens = model_tokens
    a = _run(model, tokens, scale_sink_value_hooks(model, 0.0))[0]
    b = _run(model, tokens, remove_sink_value_hooks(model))[0]
    assert torch.equal(a, b)
    assert not torch.allclose(a, _run(model, tokens)[0])


@pytest.mark.parametrize("lam", [0.0, 0.5, 2.0])
def test_scaled_sink_changes_attention_output_by_the_sink_term(model_tokens, lam):
    """At the edited layer: out(λ) = Σ_{j>0} α_ij ṽ_j + λ α_i0 ṽ_0 (+ b_O), pattern unchanged."""
    model, tokens = model_tokens
    layer = 1
    _, v_base, p_base, _ = _run(model, tokens, layer=layer)
    _, v_new, p_new, out_new = _run(model, tokens, scale_sink_value_hooks(model, lam, layers=[layer]), layer=layer)
    torch.testing.assert_close(p_new, p_base)
    torch.testing.assert_close(v_new[:, 0], lam * v_base[:, 0])
    torch.testing.assert_close(v_new[:, 1:], v_base[:, 1:])
    expected = v_base.clone()
    expected[:, 0] *= lam
    if out_new is not None:
        torch.testing.assert_close(
            out_new.double(), _expected_attn_out(model, p_base, expected, layer), atol=1e-5, rtol=1e-4
        )
    if lam == 0.0:  # removing v_0 removes exactly the term α_i0 ṽ_0
        no_sink = p_base.clone()
        no_sink[..., 0] = 0
        if out_new is not None:
            torch.testing.assert_close(
                out_new.double(), _expected_attn_out(model, no_sink, v_base, layer), atol=1e-5, rtol=1e-4
            )


def test_gqa_kv_head_edit_touches_exactly_its_query_group():
    model = make_tiny("gqa")  # 4 query heads, 2 kv heads: group 1 = query heads 2, 3
    tokens = tiny_tokens(model, length=12)
    layer = 0
    edit = scale_sink_value(model, 0.0, layers=[layer], kv_heads=[1])
    assert edit.query_heads == (2, 3) and edit.kv_heads == (1,) and edit.layers == (layer,)
    _, v_base, pattern, _ = _run(model, tokens, layer=layer)
    _, v_new, _, out_new = _run(model, tokens, edit.fwd_hooks, layer=layer)
    assert torch.equal(v_new[:, 0, 0], v_base[:, 0, 0]) and torch.all(v_new[:, 0, 1] == 0)
    # the head-by-head reference: only query heads 2 and 3 lose their sink term
    masked = pattern.clone()
    masked[:, 2:, :, 0] = 0
    torch.testing.assert_close(out_new.double(), _expected_attn_out(model, masked, v_base, layer), atol=1e-5, rtol=1e-4)


def test_gqa_query_head_selection_must_cover_whole_groups():
    model = make_tiny("gqa")
    with pytest.raises(PartialKVGroupError, match="kv head 0"):
        scale_sink_value_hooks(model, 0.0, heads=[0])
    with pytest.raises(PartialKVGroupError):
        scale_sink_value_hooks(model, 0.0, heads=[1, 2, 3])
    assert kv_heads_of(model, [2, 3]) == (1,)
    assert scale_sink_value(model, 0.0, heads=[0, 1, 2, 3]).kv_heads == (0, 1)
    assert affected_query_heads(model, [0]) == (0, 1)
    mha = make_tiny("mha")
    assert scale_sink_value(mha, 0.0, heads=[2]).query_heads == (2,)


def test_bad_selections_raise_clear_errors():
    model = make_tiny("gqa")
    with pytest.raises(IndexError, match="layers"):
        scale_sink_value_hooks(model, 0.5, layers=[7])
    with pytest.raises(IndexError, match="kv heads"):
        scale_sink_value_hooks(model, 0.5, kv_heads=[2])
    with pytest.raises(IndexError, match="query heads"):
        scale_sink_value_hooks(model, 0.5, heads=[4])
    with pytest.raises(ValueError, match="either"):
        scale_sink_value_hooks(model, 0.5, heads=[0, 1], kv_heads=[0])
    with pytest.raises(ValueError, match="finite"):
        scale_sink_value_hooks(model, float("nan"))


def test_mean_sink_value_replaces_v0_by_the_mean_non_sink_value(model_tokens):
    model, tokens = model_tokens
    layer = 1
    _, v_base, pattern, _ = _run(model, tokens, layer=layer)
    _, v_new, _, out_new = _run(model, tokens, mean_sink_value_hooks(model, layers=[layer]), layer=layer)
    torch.testing.assert_close(v_new[:, 0], v_base[:, 1:].mean(1))
    expected = v_base.clone()
    expected[:, 0] = v_base[:, 1:].mean(1)
    if out_new is not None:
        torch.testing.assert_close(
            out_new.double(), _expected_attn_out(model, pattern, expected, layer), atol=1e-5, rtol=1e-4
        )


@pytest.mark.parametrize("manager", ["scaled", "mean", "removed"])
def test_no_hook_remains_after_an_exception(model_tokens, manager):
    model, tokens = model_tokens
    before = active_hook_count(model)
    cms = {
        "scaled": lambda: scaled_sink_value(model, 0.0, layers=[0]),
        "mean": lambda: mean_sink_value_applied(model),
        "removed": lambda: removed_sink_value(model, layers=[1]),
    }
    with pytest.raises(RuntimeError, match="boom"):
        with cms[manager]() as edit:
            assert active_hook_count(model) == before + len(edit.fwd_hooks)
            model(tokens)
            raise RuntimeError("boom")
    assert active_hook_count(model) == before
    torch.testing.assert_close(_run(model, tokens)[0], _run(model, tokens)[0])


def test_context_manager_output_matches_run_with_hooks(model_tokens):
    model, tokens = model_tokens
    hooks = scale_sink_value_hooks(model, 0.3, layers=[0])
    with torch.no_grad():
        ref = model.run_with_hooks(tokens, fwd_hooks=hooks)
        with scaled_sink_value(model, 0.3, layers=[0]):
            got = model(tokens)
    assert torch.equal(ref, got)


def test_gqa_edits_happen_in_kv_head_space():
    """kv_heads=[1] edits only kv head 1; the layer output equals Σ_h α ṽ with the edited kv value."""
    model = make_tiny("gqa")  # 4 query heads, 2 kv heads
    tokens = tiny_tokens(model, length=12)
    layer = 0
    edit = sink_edit(model, SinkEditSpec("rotate", seed=3), layers=[layer], kv_heads=[1])
    assert edit.query_heads == (2, 3)
    _, v_base, pattern, _ = _run(model, tokens, layer=layer)
    _, v_new, _, out_new = _run(model, tokens, edit.fwd_hooks, layer=layer)
    assert v_new.shape[2] == 2
    assert torch.equal(v_new[:, :, 0], v_base[:, :, 0]) and torch.equal(v_new[:, 1:], v_base[:, 1:])
    assert not torch.allclose(v_new[:, 0, 1], v_base[:, 0, 1])
    torch.testing.assert_close(out_new.double(), _expected_attn_out(model, pattern, v_new, layer), atol=1e-5, rtol=1e-4)
