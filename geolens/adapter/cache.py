"""Reading entries of an activation cache (a TransformerLens ``ActivationCache`` or any mapping
from hook names to tensors), with one error that says how to fill a cache geolens can read."""

from __future__ import annotations

from torch import Tensor


def cache_lookup(cache, name: str) -> Tensor | None:
    """``cache[name]`` or None when the cache lacks that entry."""
    try:
        return cache[name]
    except KeyError:
        return None


def _cache_get(cache, name: str) -> Tensor:
    found = cache_lookup(cache, name)
    if found is not None:
        return found
    raise KeyError(
        f"the cache has no entry {name!r}. geolens needs hook_pattern and hook_v of each layer it "
        "analyses: run `model.run_with_cache(tokens, names_filter=geolens.names_filter(model))` "
        "(or cache everything with a plain run_with_cache)."
    )
