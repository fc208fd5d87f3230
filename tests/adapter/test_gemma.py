"""Gemma adapters (geolens.adapter.gemma): a HookedTransformer-like model with a norm after attention
gets GemmaHookedAdapter (a plain one HookedAdapter), and the attention sum it has no hook for is
refused by name."""

from __future__ import annotations

import pytest

from adapter.conftest import stand_in


def test_stand_ins_are_hooked_families():
    from geolens.adapter import GemmaHookedAdapter, HookedAdapter, adapter_for

    plain, gemma = adapter_for(stand_in()), adapter_for(stand_in(post_norm=True))
    assert type(plain) is HookedAdapter and type(gemma) is GemmaHookedAdapter
    assert plain.attn_out_hook(0) == "blocks.0.hook_attn_out" and plain.model_mode == "hooked"
    with pytest.raises(ValueError, match="norm after attention"):
        gemma.attn_out_hook(0)
