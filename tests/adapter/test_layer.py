"""One layer's attention inputs read from a cache (geolens.adapter.layer): the layouts of the view, and
a cache whose shapes disagree or that looks padded without its mask refused."""

from __future__ import annotations

import pytest

import geolens
from geolens.adapter import get_attention_layer, hook_name


def test_layer_view_layouts(tiny):
    model, tokens, cache = tiny
    view = get_attention_layer(model, cache, 0)
    b, n = tokens.shape
    cfg = model.cfg
    assert view.pattern.shape == (b, cfg.n_heads, n, n)
    assert view.v.shape == (b, n, cfg.n_heads, cfg.d_head)
    assert view.W_O.shape == (cfg.n_heads, cfg.d_head, cfg.d_model)
    assert view.b_O.shape == (cfg.d_model,)
    assert view.model_mode == geolens.adapter.model_mode(model)


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
