"""docs/method.md §1–2: every quantity against the naive float64 reference and the model's forward pass."""

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


@pytest.mark.parametrize("mode", MODES)
def test_factors_match_naive_reference_and_multiply_to_c(tiny, mode):
    model, _, cache = tiny
    f = geolens.influence_factors(model, cache, 1, mode, dtype=torch.float64)
    rel, cos = reference.factors(model, cache, 1, mode)
    torch.testing.assert_close(f.relative_norm, rel, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(f.alignment, cos, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(f.contribution, reference.contributions(model, cache, 1, mode), rtol=1e-8, atol=1e-10)
    assert f.mode == mode and f.model_mode == geolens.adapter.model_mode(model)


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


def test_metrics_same_shape_and_baselines(tiny):
    model, _, cache = tiny
    m = geolens.attention_metrics(model, cache, 1)
    shapes = {name: tuple(t.shape) for name, t in m.as_dict().items()}
    assert len(set(shapes.values())) == 1
    norms = geolens.projected_value_norms(geolens.get_attention_layer(model, cache, 1))
    torch.testing.assert_close(m.value_weighted, m.raw_attention * norms[:, :, None, :])
    out_norm = geolens.head_outputs(geolens.get_attention_layer(model, cache, 1)).norm(dim=-1)  # [b,q,h]
    torch.testing.assert_close(
        m.output_normalized, m.value_weighted / out_norm.permute(0, 2, 1)[..., None], rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(m.contribution, geolens.contribution_weights(model, cache, 1))


@pytest.mark.parametrize("mode", MODES)
def test_query_chunking_is_identical(tiny, mode):
    model, _, cache = tiny
    full = geolens.attention_metrics(model, cache, 0, mode)
    chunked = geolens.attention_metrics(model, cache, 0, mode, query_chunk_size=5)
    for name in full.METRIC_NAMES:
        torch.testing.assert_close(getattr(chunked, name), getattr(full, name), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        geolens.contribution_weights(model, cache, 0, mode, query_chunk_size=3),
        geolens.contribution_weights(model, cache, 0, mode),
        rtol=0,
        atol=1e-6,
    )


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
