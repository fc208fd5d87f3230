"""The adapter: layouts, GQA mapping, missing hooks, shape mismatches, padding."""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.adapter import expand_kv_heads, get_attention_layer, hook_name


def test_expand_kv_heads_is_repeat_interleave():
    v = torch.arange(3 * 2).reshape(1, 3, 2, 1).float()  # kv heads 0, 1
    e = expand_kv_heads(v, 4)
    for h in range(4):
        assert torch.equal(e[:, :, h], v[:, :, h // 2])
    assert expand_kv_heads(v, 2) is v
    with pytest.raises(ValueError, match="does not divide"):
        expand_kv_heads(v, 3)


def test_layer_view_layouts(tiny):
    model, tokens, cache = tiny
    view = get_attention_layer(model, cache, 0)
    b, n = tokens.shape
    cfg = model.cfg
    assert view.pattern.shape == (b, cfg.n_heads, n, n)
    assert view.v.shape == (b, n, cfg.n_heads, cfg.d_head)
    assert view.W_O.shape == (cfg.n_heads, cfg.d_head, cfg.d_model)
    assert view.b_O.shape == (cfg.d_model,)
    assert view.model_mode == geolens.model_mode(model)


def test_names_filter_keeps_only_what_is_needed(tiny_gqa):
    model, _, cache = tiny_gqa
    assert set(cache.keys()) >= {hook_name(0, "attn.hook_pattern"), hook_name(1, "attn.hook_v")}
    assert all("hook_pattern" in k or "hook_v" in k for k in cache.keys())


def test_missing_cache_entry_names_the_hook_and_the_fix(tiny_gqa):
    model, tokens, _ = tiny_gqa
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    with pytest.raises(KeyError, match=r"blocks\.0\.attn\.hook_v.*names_filter"):
        geolens.contribution_weights(model, cache, 0)


def test_shape_mismatch_is_refused(tiny_gqa):
    model, _, cache = tiny_gqa
    bad = dict(cache.items())
    bad[hook_name(0, "attn.hook_v")] = bad[hook_name(0, "attn.hook_v")][:, :-1]
    with pytest.raises(ValueError, match="does not match hook_pattern"):
        geolens.contribution_weights(model, bad, 0)


def test_padded_batch_is_refused(tiny_gqa):
    model, _, cache = tiny_gqa
    padded = dict(cache.items())
    p = padded[hook_name(0, "attn.hook_pattern")].clone()
    p[1, :, :, 0] = 0  # row 1: the first key is masked out (left padding)
    padded[hook_name(0, "attn.hook_pattern")] = p
    with pytest.raises(ValueError, match="padded"):
        geolens.contribution_weights(model, padded, 0)


def test_model_mode_recorded():
    from conftest import HAS_BRIDGE, make_tiny

    model = make_tiny("gqa")
    assert geolens.model_mode(model) == ("bridge" if HAS_BRIDGE else "hooked")
    if HAS_BRIDGE:
        assert geolens.model_mode(make_tiny("mha", compatibility_mode=True)) == "bridge-compat"
