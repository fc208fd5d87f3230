"""Hook names and the grouped-query layout (geolens.layout): expand_kv_heads is repeat_interleave, and
kv_group_size / kv_head_of against a group-by-group loop for every small (heads, kv heads) pair."""

from __future__ import annotations

import pytest
import torch
from reference import naive_kv_of

from geolens.adapter import expand_kv_heads


def test_expand_kv_heads_is_repeat_interleave():
    v = torch.arange(3 * 2).reshape(1, 3, 2, 1).float()  # kv heads 0, 1
    e = expand_kv_heads(v, 4)
    for h in range(4):
        assert torch.equal(e[:, :, h], v[:, :, h // 2])
    assert expand_kv_heads(v, 2) is v
    with pytest.raises(ValueError, match="does not divide"):
        expand_kv_heads(v, 3)


def test_the_kv_grouping_rule_against_a_naive_loop():
    from geolens.adapter import kv_group_size, kv_head_of

    for n_kv in range(1, 5):
        for group in range(1, 5):
            n_heads = n_kv * group
            naive = naive_kv_of(n_heads, n_kv)
            assert kv_group_size(n_heads, n_kv) == group
            assert [kv_head_of(h, n_heads, n_kv) for h in range(n_heads)] == naive
            x = torch.randn(2, 3, n_kv, 4, dtype=torch.float64)
            e = expand_kv_heads(x, n_heads)
            w = expand_kv_heads(x.permute(2, 0, 1, 3), n_heads, dim=0)  # kv heads first
            for h in range(n_heads):
                assert torch.equal(e[:, :, h], x[:, :, naive[h]])
                assert torch.equal(w[h], x[:, :, naive[h]])
    with pytest.raises(ValueError, match="does not divide"):
        kv_group_size(6, 4)
