"""Shared inputs of the adapter tests: ``stand_in``, a minimal model that is no TransformerLens model
(imported as ``from adapter.conftest import stand_in``)."""

from __future__ import annotations

from types import SimpleNamespace


def stand_in(post_norm: bool = False, **attn):
    """A minimal non-bridge model (config + attention weights, 4 query heads over 2 kv heads), as in
    tests/test_properties.py."""
    cfg = SimpleNamespace(n_layers=1, n_heads=4, n_key_value_heads=2, d_head=3, d_model=5)
    if post_norm:
        cfg.use_normalization_before_and_after = True
    return SimpleNamespace(cfg=cfg, blocks=[SimpleNamespace(attn=SimpleNamespace(**attn))])
