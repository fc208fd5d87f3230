"""What every adapter does (geolens.adapter.base.ModelAdapter) on a model that is no TransformerLens
model: a 2-D nn.Linear W_V split per kv head, b_V zeros when absent, W_V of another shape refused."""

from __future__ import annotations

import pytest
import torch
from reference import naive_kv_of

from adapter.conftest import stand_in


def test_value_weights_fallbacks():
    """A 2-D W_V in nn.Linear layout [kv_head·d_head, d_model] is split per kv head; no b_V → zeros."""
    from geolens.adapter import adapter_for

    weight = torch.randn(2 * 3, 5)
    W_V, b_V = adapter_for(stand_in(W_V=weight)).value_weights(0)
    naive = naive_kv_of(4, 2)
    for h in range(4):
        k = naive[h]
        assert torch.equal(W_V[h], weight[k * 3 : (k + 1) * 3].T)
    assert torch.equal(b_V, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="expected \\[head, d_model, d_head\\]"):
        adapter_for(stand_in(W_V=torch.zeros(2, 3, 5, 1))).value_weights(0)
    with pytest.raises(ValueError, match="W_V has 3 heads, which does not divide"):
        adapter_for(stand_in(W_V=torch.zeros(3, 5, 3))).value_weights(0)
