"""docs/method.md §1–2: the contribution weights and the quantities they are built from against the naive
float64 reference and the model's forward pass (the factors and the metrics: tests/test_factors.py)."""

from __future__ import annotations

import warnings

import pytest
import reference
import torch

import geolens
from geolens.adapter import attn_out_hook, has_post_attention_norm
from geolens.contributions import contribution_weights_from_layer

MODES = ["intra", "inter"]


@pytest.mark.parametrize("mode", MODES)
def test_contributions_match_naive_reference(tiny, mode):
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        got = geolens.contribution_weights(model, cache, layer, mode, dtype=torch.float64)
        want = reference.contributions(model, cache, layer, mode)
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_projected_value_norms_match_materialised(tiny):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 0, dtype=torch.float64)
    want = reference.projected_values(model, cache, 0).norm(dim=-1)
    torch.testing.assert_close(geolens.projected_value_norms(layer), want, rtol=1e-8, atol=1e-10)


def test_intra_rows_sum_to_one_and_inter_sums_over_heads_and_sources(tiny):
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        intra = geolens.contribution_weights(model, cache, layer, "intra")
        inter = geolens.contribution_weights(model, cache, layer, "inter")
        torch.testing.assert_close(intra.sum(-1), torch.ones_like(intra.sum(-1)), atol=1e-5, rtol=0)
        total = geolens.per_source_totals(inter)
        torch.testing.assert_close(total.sum(-1), torch.ones_like(total.sum(-1)), atol=1e-5, rtol=0)


def test_all_layers_stack(tiny):
    model, _, cache = tiny
    c = geolens.contribution_weights(model, cache, None, "inter")
    assert c.shape[0] == model.cfg.n_layers
    torch.testing.assert_close(c[1], geolens.contribution_weights(model, cache, 1, "inter"))


def test_reconstructs_pre_norm_attention_output_and_hook_z(tiny):
    """Σ_h Σ_j α ṽ + b_O = pre-norm attention output; z W_O per head = Σ_j α ṽ (docs/method.md §0)."""
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        view = geolens.get_attention_layer(model, cache, layer)
        torch.testing.assert_close(view.z, cache[f"blocks.{layer}.attn.hook_z"].float(), atol=1e-5, rtol=1e-5)
        vt = reference.projected_values(model, cache, layer).float()
        per_head = torch.einsum("bhqk,bhkm->bqhm", view.pattern, vt)
        torch.testing.assert_close(geolens.head_outputs(view), per_head, atol=1e-5, rtol=1e-5)
        out = geolens.layer_output(view) + view.b_O
        torch.testing.assert_close(out, cache[attn_out_hook(model, layer)], atol=1e-5, rtol=1e-5)
        if has_post_attention_norm(model):  # Gemma: hook_attn_out is after the norm
            assert not torch.allclose(out, cache[f"blocks.{layer}.hook_attn_out"], atol=1e-3)


def test_bf16_cache_computed_in_float32(tiny_gqa):
    model, _, cache = tiny_gqa
    half = {k: v.to(torch.bfloat16) for k, v in cache.items()}
    c = geolens.contribution_weights(model, half, 0)
    assert c.dtype == torch.float32
    torch.testing.assert_close(c.sum(-1), torch.ones_like(c.sum(-1)), atol=1e-5, rtol=0)


def test_zero_norm_output_is_defined_and_warns(tiny_gqa):
    model, _, cache = tiny_gqa
    view = geolens.get_attention_layer(model, cache, 0)
    view.v = view.v.clone()
    view.v[:, :, 1] = 0  # head 1 (and its kv group's) values vanish: zero head output
    with pytest.warns(geolens.contributions.ZeroNormOutputWarning, match="zero norm"):
        c = contribution_weights_from_layer(view, "intra")
    assert torch.isfinite(c).all()
    assert (c[:, 1] == 0).all()
    torch.testing.assert_close(c[:, 0].sum(-1), torch.ones_like(c[:, 0].sum(-1)), atol=1e-5, rtol=0)


def test_no_warning_for_normal_outputs(tiny_gqa):
    model, _, cache = tiny_gqa
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        geolens.contribution_weights(model, cache, 0)


def test_bad_mode_and_layer(tiny_gqa):
    model, _, cache = tiny_gqa
    with pytest.raises(ValueError, match="mode"):
        geolens.contribution_weights(model, cache, 0, mode="all")  # modes: intra, inter, both
    with pytest.raises(IndexError, match="out of range"):
        geolens.contribution_weights(model, cache, 7)


def test_the_cache_readers_declare_their_shared_keyword_arguments_alike():
    """contribution_weights, attention_metrics and influence_factors take the options of
    contributions.ReadOptions, keyword-only, with its defaults, after (model, cache, layer, mode)."""
    import inspect
    from dataclasses import fields

    from geolens.contributions import ReadOptions

    for fn in (geolens.contribution_weights, geolens.attention_metrics, geolens.influence_factors):
        params = inspect.signature(fn).parameters
        assert list(params)[:4] == ["model", "cache", "layer", "mode"], fn.__name__
        for f in fields(ReadOptions):
            assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY, (fn.__name__, f.name)
            assert params[f.name].default == f.default, (fn.__name__, f.name)


@pytest.mark.parametrize("mode", ["intra", "inter"])
def test_head_selects_one_heads_weights_against_the_naive_reference(tiny, mode):
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        naive = reference.contributions(model, cache, layer, mode)
        for head in (0, -1):
            got = geolens.contribution_weights(model, cache, layer, mode, dtype=torch.float64, head=head)
            torch.testing.assert_close(got, naive[:, head], atol=1e-9, rtol=1e-9)
    with pytest.raises(IndexError, match="head=99 is out of range"):
        geolens.contribution_weights(model, cache, 0, head=99)
