"""``mode="both"``: intra- and inter-head contribution weights in one pass equal the two
single-mode results (and the naive float64 reference), chunked or not (issue 15)."""

from __future__ import annotations

import pytest
import reference
import torch

from geolens import contribution_weights
from geolens.contributions import ContributionPair


def test_both_equals_single_modes(tiny):
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        pair = contribution_weights(model, cache, layer, "both", dtype=torch.float64)
        assert isinstance(pair, ContributionPair)
        intra, inter = pair
        torch.testing.assert_close(intra, contribution_weights(model, cache, layer, "intra", dtype=torch.float64))
        torch.testing.assert_close(inter, contribution_weights(model, cache, layer, "inter", dtype=torch.float64))
        torch.testing.assert_close(intra, reference.contributions(model, cache, layer, "intra"))
        torch.testing.assert_close(inter, reference.contributions(model, cache, layer, "inter"))


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_both_chunked_equals_unchunked(tiny, chunk):
    model, _, cache = tiny
    full = contribution_weights(model, cache, None, "both")
    part = contribution_weights(model, cache, None, "both", query_chunk_size=chunk)
    assert full.intra.shape[0] == model.cfg.n_layers
    torch.testing.assert_close(part.intra, full.intra)
    torch.testing.assert_close(part.inter, full.inter)


def test_both_memory_budget_counts_both_modes(tiny):
    model, tokens, cache = tiny
    b, n = tokens.shape
    row = b * model.cfg.n_heads * n * 4  # one query row of one float32 temporary
    # enough for one query row of a single mode (3 temporaries) but not of both (6)
    with pytest.raises(ValueError, match="below the"):
        contribution_weights(model, cache, 0, "both", memory_budget_bytes=4 * row)
    contribution_weights(model, cache, 0, "intra", memory_budget_bytes=4 * row)
    pair = contribution_weights(model, cache, 0, "both", memory_budget_bytes=6 * row)
    torch.testing.assert_close(pair.inter, contribution_weights(model, cache, 0, "inter"))


def test_unknown_mode(tiny):
    model, _, cache = tiny
    with pytest.raises(ValueError, match="mode must be one of 'intra', 'inter', 'both'"):
        contribution_weights(model, cache, 0, "all")
