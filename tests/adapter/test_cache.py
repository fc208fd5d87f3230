"""Reading cache entries (geolens.adapter.cache): a lookup returns the entry or None, on an
ActivationCache and on a plain dict, and a missing entry is a KeyError naming the hook and how to
fill the cache."""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.adapter.cache import _cache_get, cache_lookup


def test_missing_cache_entry_names_the_hook_and_the_fix(tiny_gqa):
    model, tokens, _ = tiny_gqa
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    with pytest.raises(KeyError, match=r"blocks\.0\.attn\.hook_v.*names_filter"):
        geolens.contribution_weights(model, cache, 0)


def test_lookup_returns_the_entry_or_none(tiny_gqa):
    _, _, cache = tiny_gqa  # a TransformerLens ActivationCache of hook_pattern, hook_v, hook_z
    name = "blocks.0.attn.hook_pattern"
    assert cache_lookup(cache, name) is cache[name] and cache_lookup(cache, "blocks.0.hook_resid_pre") is None
    plain = {name: torch.ones(1)}
    assert cache_lookup(plain, name) is plain[name] and cache_lookup(plain, "nothing") is None
    assert _cache_get(plain, name) is plain[name]
    with pytest.raises(KeyError, match=r"'nothing'.*names_filter=geolens\.names_filter\(model\)"):
        _cache_get(plain, "nothing")
