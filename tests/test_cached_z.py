"""The forward's own z (``hook_z``) is used instead of recomputing α v only when it agrees with α
and v (Freivalds' check); any other z is rejected and the result is the recomputed one."""

from __future__ import annotations

import pytest
import reference
import torch
from conftest import make_tiny

import geolens
from geolens import contribution_weights, get_attention_layer
from geolens.contributions import (
    contribution_weight_pair,
    contribution_weight_pair_from_layer,
    contribution_weights_from_layer,
)
from geolens.testing import tiny_tokens


@pytest.fixture(scope="module")
def gqa_24():
    torch.manual_seed(0)
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, length=24)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    entries = {k: cache[k] for k in cache.keys()}
    return model, entries


def _without_z(entries):
    return {k: v for k, v in entries.items() if not k.endswith("hook_z")}


def test_names_filter_caches_z(gqa_24):
    model, entries = gqa_24
    assert all(geolens.adapter_for(model).z_hook(l) in entries for l in range(model.cfg.n_layers))


@pytest.mark.parametrize("mode", ["intra", "inter", "both"])
def test_cached_z_gives_the_recomputed_result(gqa_24, mode):
    model, entries = gqa_24
    for l in range(model.cfg.n_layers):
        layer = get_attention_layer(model, entries, l)
        assert layer.z_hint is not None and layer.z_agrees(layer.z_hint)
        with_z = (
            contribution_weight_pair_from_layer(layer)
            if mode == "both"
            else contribution_weights_from_layer(layer, mode)
        )
        assert "z" in layer.__dict__ and layer.z is layer.z_hint  # checked during the pass, then kept
        without = (
            contribution_weight_pair(model, _without_z(entries), l)
            if mode == "both"
            else contribution_weights(model, _without_z(entries), l, mode)
        )
        for a, b in zip(*((with_z, without) if mode == "both" else ((with_z,), (without,)))):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        for m, got in zip(("intra", "inter"), with_z if mode == "both" else (with_z,)):
            want = reference.contributions(model, entries, l, mode if mode != "both" else m)
            torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("edit", ["one_row_one_head", "scaled", "shifted_rows"])
def test_an_edited_z_is_rejected(gqa_24, edit):
    """A z that is not α v (a hook ablated a head at some positions, another run, ...) must not
    be used: the result equals the one computed without it, and the naive reference."""
    model, entries = gqa_24
    name = geolens.adapter_for(model).z_hook(1)
    z = entries[name].clone()
    if edit == "one_row_one_head":
        z[:, 17, 2] = 0.0  # one head ablated at one query position
    elif edit == "scaled":
        z = z * 1.001
    else:
        z = torch.roll(z, 1, dims=1)
    edited = dict(entries, **{name: z})
    layer = get_attention_layer(model, edited, 1)
    assert not layer.z_agrees(z)
    for mode in ("intra", "inter"):
        got = contribution_weights(model, edited, 1, mode)
        torch.testing.assert_close(got, contribution_weights(model, _without_z(entries), 1, mode), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got.double(), reference.contributions(model, entries, 1, mode), atol=1e-5, rtol=1e-4)
    pair = contribution_weight_pair_from_layer(get_attention_layer(model, edited, 1))
    torch.testing.assert_close(
        pair.inter, contribution_weights(model, _without_z(entries), 1, "inter"), atol=1e-6, rtol=1e-5
    )


def test_cached_z_with_query_chunks_and_all_layers(gqa_24):
    model, entries = gqa_24
    full = contribution_weight_pair(model, _without_z(entries), None)
    for chunk in (1, 5, 11):
        part = contribution_weight_pair(model, entries, None, query_chunk_size=chunk)
        torch.testing.assert_close(part.intra, full.intra, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(part.inter, full.inter, atol=1e-6, rtol=1e-5)


def test_a_lower_precision_z_is_not_a_hint(gqa_24):
    """bf16 z carries the model's rounding: it is never used for a float32 (or float64) computation."""
    model, entries = gqa_24
    name = geolens.adapter_for(model).z_hook(0)
    low = dict(entries, **{name: entries[name].to(torch.bfloat16)})
    assert get_attention_layer(model, low, 0).z_hint is None
    assert get_attention_layer(model, entries, 0, dtype=torch.float64).z_hint is None
    layer = get_attention_layer(model, entries, 0)
    assert not layer.z_agrees(entries[name].to(torch.bfloat16))


def test_z_is_not_used_with_an_attention_mask():
    """With padding the pattern and v are masked after the forward, so the forward's z is stale."""
    torch.manual_seed(0)
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, length=10)
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=geolens.names_filter(model))
    assert get_attention_layer(model, cache, 0, attention_mask=mask).z_hint is None


def test_cache_layer_check_sees_a_grown_cache(gqa_24):
    """The deepest block of a cache is remembered per cache object, but a cache that gains entries
    (here a block the model does not have) is checked again."""

    class Cache(dict):  # weakly referenceable, like ActivationCache
        pass

    model, entries = gqa_24
    cache = Cache(entries)
    get_attention_layer(model, cache, 0)
    cache[f"blocks.{model.cfg.n_layers + 3}.attn.hook_v"] = entries[geolens.adapter_for(model).value_hook(0)]
    with pytest.raises(ValueError, match="another model"):
        get_attention_layer(model, cache, 0)
