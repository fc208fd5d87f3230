"""The random baseline of the selection study (geolens.selection.baseline): seeded nested random
rankings, and document means with bootstrap intervals and paired comparisons against explicit loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geolens.selection import top_n_mask
from geolens.selection.baseline import document_means_ci, paired_comparison, random_rankings


def test_random_rankings_are_seeded_and_nested_across_n():
    vis = torch.arange(10)[None, :] <= torch.tensor([4, 9])[:, None]
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    r1, r2 = random_rankings(vis, 16, generator=g1), random_rankings(vis, 16, generator=g2)
    assert torch.equal(r1, r2) and r1.shape == (16, 2, 10)
    for n in range(1, 5):
        small, big = top_n_mask(r1, vis, n), top_n_mask(r1, vis, n + 1)
        assert bool((small <= big).all()) and bool((small <= vis).all())
    assert bool(torch.isinf(r1[:, 0, 5:]).all())


def test_document_means_ci_against_explicit_loop():
    x = np.random.default_rng(0).normal(size=(30, 2))
    mean, lo, hi = document_means_ci(x, n_boot=500, seed=3)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 30, size=(500, 30))
    boots = np.array([[x[idx[b], k].mean() for k in range(2)] for b in range(500)])
    np.testing.assert_allclose(mean, x.mean(0))
    np.testing.assert_allclose(lo, np.percentile(boots, 2.5, axis=0))
    np.testing.assert_allclose(hi, np.percentile(boots, 97.5, axis=0))
    m, l, h = document_means_ci(np.full(10, 0.3))
    assert m[0] == pytest.approx(0.3) and l[0] == pytest.approx(0.3) and h[0] == pytest.approx(0.3)
    t = paired_comparison(x[:, :1] + 1, x[:, :1], np.ones((30, 1)), [4], n_boot=200)
    assert (
        t.loc[0, "diff"] == pytest.approx(1.0)
        and t.loc[0, "diff_lo"] == pytest.approx(1.0)
        and t.loc[0, "win_share"] == 1
    )
    with pytest.raises(ValueError, match="per-document"):
        paired_comparison(x, x[:, :1], x, [1, 2])
