"""``contribution_weight_pair``: intra- and inter-head contribution weights in one pass equal the
two single-mode results of ``contribution_weights`` (and the naive float64 reference), chunked or
not; ``out=`` for both."""

from __future__ import annotations

import pytest
import reference
import torch

from geolens import contribution_weights
from geolens.contributions import ContributionPair, contribution_weight_pair, contribution_weight_pair_from_layer


def test_both_equals_single_modes(tiny):
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        pair = contribution_weight_pair(model, cache, layer, dtype=torch.float64)
        assert isinstance(pair, ContributionPair)
        intra, inter = pair
        torch.testing.assert_close(intra, contribution_weights(model, cache, layer, "intra", dtype=torch.float64))
        torch.testing.assert_close(inter, contribution_weights(model, cache, layer, "inter", dtype=torch.float64))
        torch.testing.assert_close(intra, reference.contributions(model, cache, layer, "intra"))
        torch.testing.assert_close(inter, reference.contributions(model, cache, layer, "inter"))


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_both_chunked_equals_unchunked(tiny, chunk):
    model, _, cache = tiny
    full = contribution_weight_pair(model, cache, None)
    part = contribution_weight_pair(model, cache, None, query_chunk_size=chunk)
    assert full.intra.shape[0] == model.cfg.n_layers
    torch.testing.assert_close(part.intra, full.intra)
    torch.testing.assert_close(part.inter, full.inter)


def test_both_memory_budget_counts_both_modes(tiny):
    model, tokens, cache = tiny
    b, n = tokens.shape
    row = b * model.cfg.n_heads * n * 4  # one query row of one float32 temporary
    # enough for one query row of a single mode (3 temporaries) but not of both (6)
    with pytest.raises(ValueError, match="below the"):
        contribution_weight_pair(model, cache, 0, memory_budget_bytes=4 * row)
    contribution_weights(model, cache, 0, "intra", memory_budget_bytes=4 * row)
    pair = contribution_weight_pair(model, cache, 0, memory_budget_bytes=6 * row)
    torch.testing.assert_close(pair.inter, contribution_weights(model, cache, 0, "inter"))


def test_unknown_mode(tiny):
    model, _, cache = tiny
    with pytest.raises(ValueError, match="mode must be one of 'intra', 'inter'"):
        contribution_weights(model, cache, 0, "all")
    with pytest.raises(ValueError, match="contribution_weight_pair"):  # one function, one return type
        contribution_weights(model, cache, 0, "both")


def _cw(model, cache, layer, mode, **kwargs):
    if mode == "both":
        return contribution_weight_pair(model, cache, layer, **kwargs)
    return contribution_weights(model, cache, layer, mode, **kwargs)


# --- out=: results written into a caller's tensor ------------------------------------------------


def _poisoned(*shape):
    """A tensor whose every entry is NaN, so that any entry the call leaves unwritten shows."""
    return torch.full(shape, float("nan"))


@pytest.mark.parametrize("mode", ["intra", "inter", "both"])
@pytest.mark.parametrize("layer", [0, None])
def test_out_holds_the_same_result(tiny, mode, layer):
    model, _, cache = tiny
    want = _cw(model, cache, layer, mode)
    shape = tuple((want.intra if mode == "both" else want).shape)
    buffer = _poisoned(2, *shape) if mode == "both" else _poisoned(*shape)
    got = _cw(model, cache, layer, mode, out=buffer)
    for g, w in zip(got if mode == "both" else [got], want if mode == "both" else [want]):
        assert torch.equal(g, w)  # every entry written (no NaN left), bit for bit
        assert g.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # a view of out


def test_out_chunked_and_strided(tiny):
    """Query chunks write into slices of out; an out with another memory layout works too."""
    model, _, cache = tiny
    want = contribution_weight_pair(model, cache, 0, query_chunk_size=5)
    pair_shape = (2, *want.intra.shape)
    strided = _poisoned(*reversed(pair_shape)).permute(*reversed(range(len(pair_shape))))  # column-major
    assert not strided.is_contiguous()
    got = contribution_weight_pair(model, cache, 0, query_chunk_size=5, out=strided)
    assert torch.equal(got.intra, want.intra) and torch.equal(got.inter, want.inter)


def test_out_reused_across_texts(tiny):
    """The loop it is for: one buffer, one text after another, each result right."""
    model, tokens, cache = tiny
    other = tokens.flip(0)  # the same shape, other rows
    with torch.no_grad():
        _, cache2 = model.run_with_cache(other)
    buffer = _poisoned(2, model.cfg.n_layers, *cache["blocks.0.attn.hook_pattern"].shape)
    first = contribution_weight_pair(model, cache, None, out=buffer)
    first_intra = first.intra.clone()
    second = contribution_weight_pair(model, cache2, None, out=buffer)
    assert torch.equal(first_intra, contribution_weights(model, cache, None, "intra"))
    assert torch.equal(second.intra, contribution_weights(model, cache2, None, "intra"))
    assert torch.equal(second.inter, contribution_weights(model, cache2, None, "inter"))


def test_out_from_layer(tiny):
    from geolens.adapter import get_attention_layer
    from geolens.contributions import contribution_weights_from_layer

    model, _, cache = tiny
    view = get_attention_layer(model, cache, 1)
    want = contribution_weights_from_layer(view, "inter")
    assert torch.equal(contribution_weights_from_layer(view, "inter", out=_poisoned(*want.shape)), want)
    pair = contribution_weight_pair_from_layer(view, out=_poisoned(2, *want.shape))
    assert isinstance(pair, ContributionPair) and torch.equal(pair.inter, want)


def test_bad_out_is_refused(tiny):
    model, _, cache = tiny
    shape = tuple(cache["blocks.0.attn.hook_pattern"].shape)
    with pytest.raises(ValueError, match=r"out has shape .* the result has shape"):
        contribution_weight_pair(model, cache, 0, out=torch.empty(shape))  # both needs [2, ...]
    with pytest.raises(ValueError, match=r"out has shape"):
        contribution_weights(model, cache, None, "intra", out=torch.empty(shape))  # all layers need [layer, ...]
    with pytest.raises(ValueError, match="out has dtype torch.float64, the result is computed in torch.float32"):
        contribution_weights(model, cache, 0, "intra", out=torch.empty(shape, dtype=torch.float64))
    with pytest.raises(ValueError, match="requires grad"):
        contribution_weights(model, cache, 0, "intra", out=torch.empty(shape, requires_grad=True))
    with pytest.raises(TypeError, match="out must be a tensor"):
        contribution_weights(model, cache, 0, "intra", out=[0.0])
    with pytest.raises(ValueError, match="an expanded tensor"):
        contribution_weights(model, cache, 0, "intra", out=torch.zeros(1).expand(shape))
    # the cache's own entries: writing there would change α while it is read, or a cache the
    # caller keeps; any layer the call reads counts, and the check comes before the first write
    for name, call in [
        ("blocks.0.attn.hook_pattern", lambda out: contribution_weights(model, cache, 0, "intra", out=out)),
        ("blocks.1.attn.hook_pattern", lambda out: contribution_weights(model, cache, 0, "intra", out=out)),
    ]:
        pattern = cache[name]
        saved = pattern.clone()
        with pytest.raises(ValueError, match="shares memory with the cached activations"):
            call(pattern)
        assert torch.equal(pattern, saved)
    layers = model.cfg.n_layers
    entries = {k: cache[k] for k in cache.keys()}
    big = torch.zeros(layers + 1, *shape)  # layer 1's pattern lives inside the out of all layers
    entries["blocks.1.attn.hook_pattern"] = big[1].copy_(cache["blocks.1.attn.hook_pattern"])
    with pytest.raises(ValueError, match="shares memory"):
        contribution_weights(model, entries, None, "intra", out=big[1:])
    assert torch.equal(big[1], cache["blocks.1.attn.hook_pattern"])  # layer 0 was not written first


def test_out_sharing_the_cache_is_refused_with_a_mask(tiny):
    """With attention_mask= the layer computes on masked copies; the cache itself must still be
    protected."""
    model, tokens, cache = tiny
    mask = torch.ones_like(tokens)
    pattern = cache["blocks.0.attn.hook_pattern"]
    saved = pattern.clone()
    with pytest.raises(ValueError, match="shares memory with the cached activations"):
        contribution_weights(model, cache, 0, "intra", attention_mask=mask, out=pattern)
    assert torch.equal(pattern, saved)


def test_out_overlapping_through_another_storage_object_is_refused(tiny):
    """Two tensors over the same bytes but different storage objects (numpy views)."""
    import numpy as np

    model, _, cache = tiny
    shape = tuple(cache["blocks.0.attn.hook_pattern"].shape)
    n = int(np.prod(shape))
    memory = np.zeros(n + 8, dtype=np.float32)
    entries = {k: cache[k] for k in cache.keys()}
    entries["blocks.0.attn.hook_pattern"] = torch.from_numpy(memory[:n].reshape(shape)).copy_(
        cache["blocks.0.attn.hook_pattern"]
    )
    out = torch.from_numpy(memory[8:].reshape(shape))  # overlaps the pattern, shifted by 8 floats
    with pytest.raises(ValueError, match="shares memory"):
        contribution_weights(model, entries, 0, "intra", out=out)
