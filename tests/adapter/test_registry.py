"""The family registry (geolens.adapter.registry): adapter_for picks the family and caches it weakly
per model, the model mode, the names filter, the grouped-query value and output weights against a
naive loop, every hook name present in the model and holding what it says, and register_family: a
family added in one file serves contribution_weights, placed before its parent, bad registrations
refused."""

from __future__ import annotations

import pytest
import torch
from reference import naive_kv_of

import geolens
from geolens.adapter import hook_name


def test_names_filter_keeps_only_what_is_needed(tiny_gqa):
    model, _, cache = tiny_gqa
    assert set(cache.keys()) >= {hook_name(0, "attn.hook_pattern"), hook_name(1, "attn.hook_v")}
    assert all(k.endswith(("hook_pattern", "hook_v", "hook_z")) for k in cache.keys())


def test_model_mode_recorded():
    from conftest import HAS_BRIDGE, make_tiny

    model = make_tiny("gqa")
    assert geolens.adapter.model_mode(model) == ("bridge" if HAS_BRIDGE else "hooked")
    if HAS_BRIDGE:
        assert geolens.adapter.model_mode(make_tiny("mha", compatibility_mode=True)) == "bridge-compat"


def _expected_family(kind: str):
    from conftest import HAS_BRIDGE

    from geolens.adapter import BridgeAdapter, GemmaBridgeAdapter, HookedAdapter

    if not HAS_BRIDGE:
        return HookedAdapter
    return GemmaBridgeAdapter if kind == "gemma" else BridgeAdapter


@pytest.mark.parametrize("kind", ["gqa", "mha", "gemma"])
def test_adapter_for_picks_the_family(kind):
    from conftest import HAS_BRIDGE, TINY_KINDS, make_tiny

    from geolens.adapter import adapter_for, attn_out_hook, has_post_attention_norm, is_bridge

    if kind not in TINY_KINDS:
        pytest.skip(f"no tiny {kind} model in this TransformerLens")
    model = make_tiny(kind)
    adapter = adapter_for(model)
    assert type(adapter) is _expected_family(kind)
    assert adapter_for(model) is adapter  # cached per model
    assert adapter.model is model
    assert is_bridge(model) == adapter.is_bridge == HAS_BRIDGE
    assert has_post_attention_norm(model) == adapter.post_attention_norm == (kind == "gemma")
    assert adapter.model_mode == geolens.adapter.model_mode(model) == ("bridge" if HAS_BRIDGE else "hooked")
    assert attn_out_hook(model, 1) == ("blocks.1.attn.hook_out" if HAS_BRIDGE else "blocks.1.hook_attn_out")
    assert adapter.n_kv_heads == (2 if kind in ("gqa", "gemma") else 4)
    assert [adapter.sliding_window(l) for l in range(2)] == ([16, None] if kind == "gemma" else [None, None])


def test_adapter_cache_holds_models_weakly():
    import gc
    import weakref
    from types import SimpleNamespace

    from geolens.adapter import HookedAdapter, adapter_for
    from geolens.adapter.registry import _ADAPTERS

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = SimpleNamespace(n_layers=1, n_heads=2, d_head=1, d_model=2)

    model = Model()
    adapter = adapter_for(model)
    assert type(adapter) is HookedAdapter and adapter_for(model) is adapter and model in _ADAPTERS
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None  # the cached adapter did not keep the model alive
    with pytest.raises(ReferenceError):
        adapter.model


def test_model_kv_grouping_and_value_weights_against_a_naive_loop(tiny):
    from geolens.adapter import adapter_for, output_weights, value_weights
    from geolens.interventions.sink_values import affected_query_heads, kv_heads_of

    model, _, _ = tiny
    adapter = adapter_for(model)
    naive = naive_kv_of(adapter.n_heads, adapter.n_kv_heads)
    assert [adapter.kv_head_of(h) for h in range(adapter.n_heads)] == naive
    for k in range(adapter.n_kv_heads):
        heads = tuple(h for h in range(adapter.n_heads) if naive[h] == k)
        assert adapter.query_heads_of([k]) == affected_query_heads(model, [k]) == heads
        assert kv_heads_of(model, heads) == (k,)
    attn = model.blocks[0].attn
    raw = getattr(attn, "_W_V", None)  # TL 2.x keeps the kv layout here; W_V is already repeated
    raw = (raw if raw is not None else attn.W_V).detach()
    W_V, b_V = value_weights(model, 0)
    assert W_V.shape == (adapter.n_heads, model.cfg.d_model, model.cfg.d_head)
    assert b_V.shape == (adapter.n_heads, model.cfg.d_head)
    for h in range(adapter.n_heads):
        torch.testing.assert_close(
            W_V[h].detach(), raw[naive[h]] if raw.shape[0] != adapter.n_heads else raw[h], rtol=0, atol=0
        )
    W_O, b_O = output_weights(model, 0)
    torch.testing.assert_close(W_O, attn.W_O, rtol=0, atol=0)


def test_hook_names_exist_and_hold_what_they_say(tiny):
    from geolens.adapter import adapter_for, hook_layer

    model, tokens, cache = tiny
    adapter = adapter_for(model)
    cfg = model.cfg
    names = [adapter.logits_hook, adapter.unembed_input_hook]
    for l in range(cfg.n_layers):
        names += [
            adapter.pattern_hook(l),
            adapter.value_hook(l),
            adapter.z_hook(l),
            adapter.resid_pre_hook(l),
            adapter.resid_post_hook(l),
            adapter.block_attn_out_hook(l),
        ]
        if not (adapter.post_attention_norm and not adapter.is_bridge):
            names.append(adapter.attn_out_hook(l))
        assert hook_layer(adapter.resid_pre_hook(l)) == l
    missing = [n for n in names if n not in model.hook_dict]
    assert not missing, missing
    assert hook_layer(adapter.logits_hook) is None
    b, n = tokens.shape
    for l in range(cfg.n_layers):
        assert cache[adapter.resid_pre_hook(l)].shape == cache[adapter.resid_post_hook(l)].shape == (b, n, cfg.d_model)
    # block l's output is block l + 1's input
    torch.testing.assert_close(cache[adapter.resid_post_hook(0)], cache[adapter.resid_pre_hook(1)], rtol=0, atol=0)
    assert cache[adapter.unembed_input_hook].shape == (b, n, cfg.d_model)
    with torch.no_grad():
        logits = model(tokens)
    torch.testing.assert_close(adapter.logits_from_cache(cache), logits, atol=1e-5, rtol=1e-5)


def test_a_family_added_in_one_file_serves_contribution_weights():
    """A family written in one place (here: a subclass of the closest family whose cache names the
    pattern, the values and z its own way), registered with register_family, is the one adapter_for
    picks, and geolens.contribution_weights through it equals the naive float64 reference."""
    import weakref

    import reference
    from conftest import HAS_BRIDGE, make_tiny

    from geolens.adapter import BridgeAdapter, HookedAdapter, adapter_for, register_family, unregister_family
    from geolens.adapter.registry import FAMILIES
    from geolens.testing import tiny_tokens

    ours = weakref.WeakSet()
    parent = BridgeAdapter if HAS_BRIDGE else HookedAdapter

    class RenamedHooks(parent):
        family = "renamed-hooks"

        @classmethod
        def matches(cls, model):
            return model in ours

        def pattern_hook(self, layer):
            return f"layer{layer}.alpha"

        def value_hook(self, layer):
            return f"layer{layer}.values"

        def z_hook(self, layer):
            return f"layer{layer}.z"

    model, other = make_tiny("gqa"), make_tiny("gqa")
    ours.add(model)
    register_family(RenamedHooks)
    try:
        assert FAMILIES.index(RenamedHooks) == FAMILIES.index(parent) - 1  # tried just before its parent
        assert type(adapter_for(model)) is RenamedHooks and type(adapter_for(other)) is parent
        tokens = tiny_tokens(model)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens)  # TransformerLens' names
        renamed = {}
        for l in range(model.cfg.n_layers):
            renamed[f"layer{l}.alpha"] = cache[hook_name(l, "attn.hook_pattern")]
            renamed[f"layer{l}.values"] = cache[hook_name(l, "attn.hook_v")]
            renamed[f"layer{l}.z"] = cache[hook_name(l, "attn.hook_z")]
        assert geolens.names_filter(model)("layer1.alpha") and not geolens.names_filter(model)(
            hook_name(1, "attn.hook_pattern")
        )
        for mode in ("intra", "inter"):
            got = geolens.contribution_weights(model, renamed, 1, mode=mode, dtype=torch.float64)
            torch.testing.assert_close(got, reference.contributions(model, cache, 1, mode), rtol=1e-9, atol=1e-9)
        with pytest.raises(KeyError, match="layer1.alpha"):  # the family's names are the ones read
            geolens.contribution_weights(model, cache, 1)
    finally:
        unregister_family(RenamedHooks)
    assert RenamedHooks not in FAMILIES


def test_register_family_places_and_refuses():
    from geolens.adapter import BridgeAdapter, HookedAdapter, ModelAdapter, register_family, unregister_family
    from geolens.adapter.registry import FAMILIES

    class Other(ModelAdapter):  # subclasses no registered family: tried first
        @classmethod
        def matches(cls, model):
            return False

    class Sub(HookedAdapter):
        pass

    class SubSub(Sub):
        pass

    before = list(FAMILIES)
    try:
        register_family(Other)
        register_family(Sub)
        assert FAMILIES[0] is Other and FAMILIES.index(Sub) == FAMILIES.index(HookedAdapter) - 1
        register_family(SubSub)  # tried before its parent Sub, which is tried before HookedAdapter
        assert FAMILIES.index(SubSub) + 1 == FAMILIES.index(Sub) == FAMILIES.index(HookedAdapter) - 1
        unregister_family(SubSub)
        register_family(SubSub, before=BridgeAdapter)
        assert FAMILIES.index(SubSub) == FAMILIES.index(BridgeAdapter) - 1
        with pytest.raises(ValueError, match="already registered"):
            register_family(Sub)
        with pytest.raises(TypeError, match="subclass of geolens.adapter.ModelAdapter"):
            register_family(object)
        with pytest.raises(ValueError, match="not a registered family"):
            register_family(type("Loose", (HookedAdapter,), {}), before=type("Unknown", (ModelAdapter,), {}))
    finally:
        for family in (Other, Sub, SubSub):
            if family in FAMILIES:
                unregister_family(family)
    assert FAMILIES == before
    with pytest.raises(ValueError, match="not a registered family"):
        unregister_family(Sub)
