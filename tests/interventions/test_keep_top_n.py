"""Keep-top-N interventions (geolens.interventions.keep_top_n): the mask against brute force, and the
hooks' edit of the head sum against the hand-built sum over the kept sources."""

from __future__ import annotations

import pytest
import reference
import torch

from geolens.interventions.base import active_hook_count, applied
from geolens.interventions.keep_top_n import keep_top_n_hooks, keep_top_n_mask


def test_keep_top_n_mask_brute_force():
    g = torch.Generator().manual_seed(0)
    score = torch.rand(2, 3, 6, 6, generator=g)
    score[0, 0, 5, 1] = score[0, 0, 5, 2]  # a tie
    for n in (1, 2, 4):
        m = keep_top_n_mask(score, n)
        for b in range(2):
            for h in range(3):
                for i in range(6):
                    cand = sorted(range(i + 1), key=lambda j: (-float(score[b, h, i, j]), j))[:n]
                    assert [j for j in range(6) if m[b, h, i, j]] == sorted(cand)


@pytest.mark.parametrize("by", ["attention", "norm"])
def test_keep_top_n_hooks_edit_the_head_sum(tiny, by):
    model, tokens, _ = tiny
    with torch.no_grad():
        base, cache = model.run_with_cache(tokens)
    n = 2
    hooks_before = active_hook_count(model)
    names = lambda name: name.endswith("hook_z") or name.endswith("hook_pattern") or name.endswith("hook_v")
    with torch.no_grad(), applied(model, keep_top_n_hooks(model, n, by=by, layers=[0])):
        _, hooked = model.run_with_cache(tokens, names_filter=names)
    assert active_hook_count(model) == hooks_before
    pattern, v, _ = reference.raw_tensors(model, cache, 0)  # layer 0 inputs are unchanged by the edit
    b, h, q, k = pattern.shape
    z = hooked["blocks.0.attn.hook_z"].double()  # [b, q, h, d]
    for bi in range(b):
        for hi in range(h):
            for i in range(q):
                score = [
                    float(pattern[bi, hi, i, j] * (v[bi, j, hi].norm() if by == "norm" else 1)) for j in range(i + 1)
                ]
                keep = sorted(range(i + 1), key=lambda j: (-score[j], j))[:n]
                want = sum(pattern[bi, hi, i, j] * v[bi, j, hi] for j in keep)
                torch.testing.assert_close(z[bi, i, hi], want, atol=1e-5, rtol=1e-4)
    with torch.no_grad(), applied(model, keep_top_n_hooks(model, tokens.shape[1], by=by)):
        same = model(tokens)
    torch.testing.assert_close(same, base)  # N ≥ visible count changes nothing
    with pytest.raises(ValueError, match="by must"):
        keep_top_n_hooks(model, 2, by="random")
