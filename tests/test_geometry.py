"""geolens.geometry (docs/method.md §2, efficient form): the Gram matrix, its cache, the norms it
gives and query chunking, each against a naive float64 reference or an unchunked pass."""

from __future__ import annotations

import doctest
import gc

import pytest
import reference
import torch

import geolens
from geolens import geometry
from geolens.contributions import (
    LayerMetrics,
    contribution_weight_pair_from_layer,
    contribution_weights_from_layer,
    layer_metrics,
)
from geolens.factors import attention_metrics
from geolens.geometry import (
    fill_query_chunks,
    gram,
    gram_norm,
    head_output_norms,
    iter_query_chunks,
    projected_value_norms,
    query_slices,
    split_query_chunk,
)


def _naive_gram(W_O: torch.Tensor) -> torch.Tensor:
    """G[h, d, e] = Σ_m W_O[h, d, m] W_O[h, e, m], explicit loops in float64."""
    W = W_O.double()
    h, d, m = W.shape
    out = torch.zeros(h, d, d, dtype=torch.float64)
    for hi in range(h):
        for i in range(d):
            for j in range(d):
                out[hi, i, j] = sum(float(W[hi, i, k]) * float(W[hi, j, k]) for k in range(m))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gram_matches_naive_loop(dtype):
    W_O = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0), dtype=dtype)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gram(W_O).double(), _naive_gram(W_O), **tol)


def test_gram_of_a_model_layer_matches_naive_loop(tiny):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 1, dtype=torch.float64)
    _, _, W_O = reference.raw_tensors(model, cache, 1)
    torch.testing.assert_close(gram(layer.W_O), _naive_gram(W_O), rtol=1e-10, atol=1e-12)


def test_gram_is_cached_per_tensor_and_recomputed_after_an_edit():
    W_O = torch.randn(2, 4, 6, dtype=torch.float64)
    G = gram(W_O)
    assert gram(W_O) is G  # cached on this tensor
    W_O.mul_(2.0)  # in place: moves the version counter
    G2 = gram(W_O)
    assert G2 is not G
    torch.testing.assert_close(G2, _naive_gram(W_O), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(G2, 4 * G, rtol=1e-12, atol=1e-12)
    other = W_O.clone()  # same values, another tensor: its own entry
    assert gram(other) is not G2
    torch.testing.assert_close(gram(other), G2, rtol=0, atol=0)


def test_gram_cache_follows_an_in_place_edit_of_the_parameter():
    """A detached view (what AttentionLayer holds) shares the parameter's version counter."""
    param = torch.nn.Parameter(torch.randn(2, 3, 5, dtype=torch.float64))
    view = param.detach()
    G = gram(view)
    with torch.no_grad():
        param[0].zero_()
    G2 = gram(view)
    assert G2 is not G and torch.equal(G2[0], torch.zeros(3, 3, dtype=torch.float64))
    torch.testing.assert_close(G2, _naive_gram(param.detach()), rtol=1e-12, atol=1e-12)


def test_gram_cache_follows_model_weights_through_get_attention_layer():
    """An in-place weight edit reaches the Gram matrix of a new and of an existing layer view."""
    from conftest import make_tiny

    model = make_tiny("gqa", seed=3)  # a private model: its weights are edited below
    tokens = geolens.testing.tiny_tokens(model, length=8)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    layer = geolens.get_attention_layer(model, cache, 0)
    before = gram(layer.W_O).clone()
    with torch.no_grad():
        for p in model.blocks[0].attn.parameters():
            p.mul_(3.0)  # W_O → 3 W_O, so G → 9 G
    after = gram(geolens.get_attention_layer(model, cache, 0).W_O)
    torch.testing.assert_close(after, 9 * before, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gram(layer.W_O), after, rtol=0, atol=0)


def test_gram_entry_leaves_with_its_tensor():
    W_O = torch.randn(2, 3, 4)
    gram(W_O)
    key = id(W_O)
    assert key in geometry._GRAMS
    del W_O
    gc.collect()
    assert key not in geometry._GRAMS


def test_gram_with_gradients_is_not_cached_and_differentiable():
    W_O = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    G = gram(W_O)
    assert gram(W_O) is not G and id(W_O) not in geometry._GRAMS
    G.sum().backward()
    # d/dW Σ_{d,e} Σ_m W_dm W_em = 2 Σ_e W_em
    torch.testing.assert_close(W_O.grad, 2 * W_O.detach().sum(1, keepdim=True).expand_as(W_O))


def test_gram_of_an_inference_tensor():
    with torch.inference_mode():
        W_O = torch.randn(2, 3, 4, dtype=torch.float64)
        G = gram(W_O)
    torch.testing.assert_close(G, _naive_gram(W_O), rtol=1e-12, atol=1e-12)


def test_gram_norm_matches_explicit_projection():
    g = torch.Generator().manual_seed(1)
    W_O = torch.randn(3, 4, 9, generator=g, dtype=torch.float64)
    for shape in [(3, 4), (5, 3, 4), (2, 5, 3, 4)]:
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        want = torch.stack([x[..., h, :] @ W_O[h] for h in range(3)], dim=-2).norm(dim=-1)
        torch.testing.assert_close(gram_norm(x, gram(W_O)), want, rtol=1e-10, atol=1e-12)


def test_gram_norm_is_zero_not_nan_in_the_kernel():
    W_O = torch.zeros(2, 3, 4)
    W_O[:, 0] = 1.0  # rank 1: directions 1 and 2 of d_head are in the kernel
    x = torch.zeros(5, 2, 3)
    x[..., 1] = 1.0
    out = gram_norm(x, gram(W_O))
    assert torch.equal(out, torch.zeros(5, 2))


def test_projected_value_norms_match_explicit_v_W_O(tiny):
    model, _, cache = tiny
    for l in range(model.cfg.n_layers):
        layer = geolens.get_attention_layer(model, cache, l, dtype=torch.float64)
        want = reference.projected_values(model, cache, l).norm(dim=-1)  # ṽ = v W_O materialised
        got = projected_value_norms(layer)
        assert got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def test_head_output_norms_match_explicit_outputs(tiny):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 1, dtype=torch.float64)
    pattern, _, _ = reference.raw_tensors(model, cache, 1)
    vt = reference.projected_values(model, cache, 1)  # [b, h, k, dm]
    o = torch.einsum("bhqk,bhkm->bqhm", pattern, vt)  # o_i^h = Σ_j α_ij ṽ_j
    torch.testing.assert_close(head_output_norms(layer), o.norm(dim=-1), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(head_output_norms(layer, slice(1, None)), o[:, 1:].norm(dim=-1), rtol=1e-8, atol=1e-10)


def test_head_output_norms_with_gqa(tiny_gqa):
    model, _, cache = tiny_gqa
    layer = geolens.get_attention_layer(model, cache, 0, dtype=torch.float64)
    torch.testing.assert_close(
        head_output_norms(layer), geolens.head_outputs(layer).norm(dim=-1), rtol=1e-10, atol=1e-12
    )


def test_query_chunks_share_one_gram(tiny_gqa):
    model, _, cache = tiny_gqa
    layer = geolens.get_attention_layer(model, cache, 0)
    G = gram(layer.W_O)
    assert all(gram(sub.W_O) is G for _, sub in iter_query_chunks(layer, query_chunk_size=5))


@pytest.mark.parametrize("mode", ["intra", "inter"])
@pytest.mark.parametrize("chunk", [dict(query_chunk_size=1), dict(query_chunk_size=5), dict(memory_budget_bytes=8000)])
def test_chunked_layer_metrics_equal_unchunked(tiny, mode, chunk):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 1)
    full = layer_metrics(layer, mode)
    part = layer_metrics(layer, mode, **chunk)
    assert isinstance(part, LayerMetrics)
    assert part.attention is layer.pattern and torch.equal(part.value_norm, full.value_norm)
    for a, b in zip(full, part):  # rows of one query (chunk 1) may round differently in matmul
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["intra", "inter", "both"])
def test_chunked_contribution_weights_equal_unchunked(tiny, mode):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 0)

    def compute(**kwargs):
        if mode == "both":
            return contribution_weight_pair_from_layer(layer, **kwargs)
        return contribution_weights_from_layer(layer, mode, **kwargs)

    full = compute()
    for size in (1, 4, 7):
        part = compute(query_chunk_size=size)
        for a, b in zip(*((x,) if mode != "both" else x for x in (full, part))):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


def test_fill_query_chunks_writes_every_query_once(tiny_gqa):
    model, _, cache = tiny_gqa
    layer = geolens.get_attention_layer(model, cache, 0)
    seen = []

    def compute(sub):
        seen.append(sub.pattern.shape[2])
        return (sub.pattern * 2, sub.pattern + 1)

    doubled, shifted = fill_query_chunks(layer, 5, compute, 2)
    assert seen == [5, 5, 2]  # 12 queries
    assert torch.equal(doubled, layer.pattern * 2) and torch.equal(shifted, layer.pattern + 1)


def test_iter_query_chunks_cover_the_queries(tiny_gqa):
    model, _, cache = tiny_gqa
    layer = geolens.get_attention_layer(model, cache, 0)
    n_q = layer.pattern.shape[2]
    for kwargs in (dict(), dict(query_chunk_size=5), dict(query_chunk_size=n_q + 3), dict(memory_budget_bytes=5000)):
        chunks = list(iter_query_chunks(layer, **kwargs))
        assert torch.equal(torch.cat([sub.pattern for _, sub in chunks], dim=2), layer.pattern)
        assert [q.start for q, _ in chunks] == sorted(q.start for q, _ in chunks)


def test_query_chunk_arguments(tiny_gqa):
    model, _, cache = tiny_gqa
    layer = geolens.get_attention_layer(model, cache, 0)
    n_q = layer.pattern.shape[2]
    assert split_query_chunk(layer) is None
    assert split_query_chunk(layer, n_q) is None  # one pass covers every query
    assert split_query_chunk(layer, 3) == 3
    for bad in (0, -2):
        with pytest.raises(ValueError, match="positive integer"):
            split_query_chunk(layer, bad)
        with pytest.raises(ValueError, match="positive integer"):
            list(query_slices(0, 4, bad))
    with pytest.raises(ValueError, match="not both"):
        split_query_chunk(layer, 3, 10**6)
    assert list(query_slices(2, 9, 3)) == [slice(2, 5), slice(5, 8), slice(8, 9)]


@pytest.mark.parametrize("mode", ["intra", "inter"])
def test_layer_metrics_fields(tiny, mode):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 1, dtype=torch.float64)
    m = layer_metrics(layer, mode)
    alpha, relative, cos, contribution, value_norm = m  # unpacks as a 5-tuple
    assert alpha is m.attention and relative is m.relative_norm and cos is m.alignment
    assert contribution is m.contribution and value_norm is m.value_norm
    torch.testing.assert_close(m.contribution, reference.contributions(model, cache, 1, mode), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(m.attention * m.relative_norm * m.alignment, m.contribution, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(m.value_norm[:, :, 0], projected_value_norms(layer), rtol=0, atol=0)
    am = attention_metrics(model, cache, 1, mode, dtype=torch.float64)
    assert torch.equal(am.value_weighted, m.attention * m.value_norm)
    assert torch.equal(am.output_normalized, m.attention * m.relative_norm)
    assert torch.equal(am.contribution, m.contribution) and torch.equal(am.raw_attention, m.attention)


def test_public_names_are_the_geometry_functions():
    for name in ("projected_value_norms", "head_output_norms", "head_outputs", "layer_output"):
        assert getattr(geolens, name) is getattr(geometry, name)


@pytest.mark.bridge_only
def test_docstring_examples():
    result = doctest.testmod(geometry, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    from geolens import contributions

    for test in finder.find(contributions.layer_metrics, "layer_metrics", globs=vars(contributions)):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0


def test_cross_head_gram_against_loops_and_its_diagonal_blocks():
    W_O = torch.randn(3, 4, 6, dtype=torch.float64)
    G = gram(W_O, cross_heads=True)
    assert G.shape == (12, 12) and gram(W_O, cross_heads=True) is G
    for h in range(3):
        for g in range(3):
            want = torch.zeros(4, 4, dtype=torch.float64)
            for d in range(4):
                for e in range(4):
                    want[d, e] = sum(W_O[h, d, m] * W_O[g, e, m] for m in range(6))
            torch.testing.assert_close(G[4 * h : 4 * h + 4, 4 * g : 4 * g + 4], want)
        torch.testing.assert_close(G[4 * h : 4 * h + 4, 4 * h : 4 * h + 4], gram(W_O)[h])
    W_O.mul_(2)  # an in-place edit invalidates the cached entry
    torch.testing.assert_close(gram(W_O, cross_heads=True), 4 * G)


def test_causal_blocks_skip_only_invisible_keys(tiny):
    from geolens.testing import tiny_tokens

    model = tiny[0]
    tokens = tiny_tokens(model, length=24)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    layer = geolens.get_attention_layer(model, cache, 0)
    assert layer.causal
    n = tokens.shape[1]
    blocks = layer.query_blocks()
    assert len(blocks) == 4 and blocks[-1][1] == n
    for queries, k_end in blocks:  # every key a query of the block can see is inside the block's range
        assert k_end == min(n, queries.stop) and bool((layer.pattern[:, :, queries, k_end:] == 0).all())
    full = torch.einsum("bhqk,bkhd->bqhd", layer.pattern, layer.v)
    torch.testing.assert_close(layer.z, full, atol=1e-6, rtol=1e-5)
    chunk = layer.query_slice(slice(7, 19))  # a query chunk keeps its absolute positions
    assert chunk.query_start == 7 and chunk.query_blocks() == [(slice(0, 12), 19)]
    by_hand = geolens.adapter.AttentionLayer(
        0, layer.pattern, layer.v, layer.W_O, layer.b_O, layer.n_kv_heads, layer.model_mode
    )
    assert not by_hand.causal and by_hand.query_blocks() == [(slice(0, n), n)]  # unknown: no skipping
    for mode in ("intra", "inter"):
        torch.testing.assert_close(
            contribution_weights_from_layer(layer, mode),
            contribution_weights_from_layer(by_hand, mode),
            atol=1e-6,
            rtol=1e-5,
        )


def test_contributions_follow_an_in_place_weight_edit(tiny_gqa):
    """W_O (and its Gram matrices) are cached across calls while the weight is unchanged; an
    in-place edit of one head must show up in the next call, equal to the naive reference."""
    model, tokens, cache = tiny_gqa
    before = geolens.contribution_weights(model, cache, layer=0, mode="inter")
    geolens.contribution_weights(model, cache, layer=0, mode="inter")  # served from the caches
    W = model.blocks[0].attn.W_O
    saved = W.detach().clone()
    try:
        with torch.no_grad():
            W[1].mul_(3.0)
        after = geolens.contribution_weights(model, cache, layer=0, mode="inter")
        want = reference.contributions(model, cache, 0, "inter")
    finally:
        with torch.no_grad():
            W.copy_(saved)
    assert not torch.allclose(after, before, atol=1e-4)
    torch.testing.assert_close(after.double(), want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(geolens.contribution_weights(model, cache, layer=0, mode="inter"), before)


def test_contributions_follow_a_write_through_data(tiny_gqa):
    """Writes through ``.data`` do not move the version counter; the cached W_O must still notice."""
    model, _, cache = tiny_gqa
    before = geolens.contribution_weights(model, cache, layer=0, mode="inter")
    W = model.blocks[0].attn.W_O
    root = W
    while root._base is not None:
        root = root._base
    saved = root.detach().clone()
    try:
        root.data[..., :4] *= 5
        after = geolens.contribution_weights(model, cache, layer=0, mode="inter")
        want = reference.contributions(model, cache, 0, "inter")
    finally:
        root.data.copy_(saved)
    assert not torch.allclose(after, before, atol=1e-4)
    torch.testing.assert_close(after.double(), want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(geolens.contribution_weights(model, cache, layer=0, mode="inter"), before)


def test_a_pattern_that_looks_ahead_is_never_treated_as_causal(tiny_gqa):
    """The config says causal; a pattern with weight after the query (a bidirectional model) must
    switch the key skipping off, so that no term is lost."""
    model, _, _ = tiny_gqa
    from geolens.testing import tiny_tokens

    tokens = tiny_tokens(model, length=24)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    name = geolens.adapter_for(model).pattern_hook(0)
    entries = {k: cache[k] for k in cache.keys()}
    entries[name] = torch.full_like(cache[name], 1.0 / 24)  # every query attends to every key
    layer = geolens.get_attention_layer(model, entries, 0)
    assert not layer.causal and layer.query_blocks() == [(slice(0, 24), 24)]
    c = contribution_weights_from_layer(layer, "intra")
    assert bool((c.triu(1) != 0).any())  # terms after the query are kept
    torch.testing.assert_close(c.sum(-1), torch.ones_like(c.sum(-1)), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="contiguous"):
        layer.query_slice(slice(0, None, 2))


@pytest.mark.parametrize("extra", [0, 10_000])
def test_cached_W_O_follows_writes_into_a_shared_buffer(tiny_gqa, monkeypatch, extra):
    """W_O as a view of a larger flat buffer (extra > 0: the fingerprint reads W_O's own entries
    instead of the whole buffer) or of a same-size one: a write through the buffer is noticed."""
    model, _, _ = tiny_gqa
    adapter = geolens.adapter_for(model)
    W_O, b_O = adapter.output_weights(0)
    W_O = W_O.detach()
    buffer = torch.zeros(extra + W_O.numel())
    buffer[extra:] = W_O.reshape(-1)
    view = buffer[extra:].view(W_O.shape)
    monkeypatch.setattr(adapter, "output_weights", lambda layer: (view, b_O))
    first, _ = adapter.compute_output_weights(0, torch.float32, "cpu")
    assert torch.equal(first, W_O)
    again, _ = adapter.compute_output_weights(0, torch.float32, "cpu")
    assert again is first  # unchanged: the same cached tensor
    buffer.data[extra + 3] += 1.0  # through .data: no version bump
    changed, _ = adapter.compute_output_weights(0, torch.float32, "cpu")
    assert changed is not first and changed.reshape(-1)[3] == W_O.reshape(-1)[3] + 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cached_W_O_follows_a_small_write_in_a_low_precision_weight(tiny_gqa, monkeypatch, dtype):
    """A bf16/fp16 W_O of a million entries: one entry changed through .data by a few of its own
    ulps is noticed (a fingerprint summed in the weight's dtype would round the change away)."""
    model, _, _ = tiny_gqa
    adapter = geolens.adapter_for(model)
    _, b_O = adapter.output_weights(0)
    g = torch.Generator().manual_seed(0)
    weight = (0.02 * torch.randn(16, 128, 512, generator=g)).to(dtype)
    monkeypatch.setattr(adapter, "output_weights", lambda layer: (weight, b_O))
    first, _ = adapter.compute_output_weights(0, torch.float32, "cpu")
    assert adapter.compute_output_weights(0, torch.float32, "cpu")[0] is first
    weight.data[3, 5, 7] += 0.05
    changed, _ = adapter.compute_output_weights(0, torch.float32, "cpu")
    assert changed is not first
    assert changed[3, 5, 7] == weight[3, 5, 7].float()


def test_gram_dot_and_cosine_against_materialised_projections():
    """x G yᵀ and cos(x W_O, y W_O) against loops over explicit x W_O (float64), broadcasting a
    sink-like [b, 1, h, d] against [b, k, h, d], with and without G, and both zero-norm rules."""
    g = torch.Generator().manual_seed(3)
    b, k, h, d, m = 2, 5, 3, 4, 7
    W_O = torch.randn(h, d, m, generator=g, dtype=torch.float64)
    x = torch.randn(b, 1, h, d, generator=g, dtype=torch.float64)
    y = torch.randn(b, k, h, d, generator=g, dtype=torch.float64)
    y[0, 2, 1] = 0  # a zero vector: no direction
    G = gram(W_O)
    dot, cos = geometry.gram_dot(x, y, G), geometry.gram_cosine(x, y, G)
    plain, cos_eps = geometry.gram_cosine(x, y), geometry.gram_cosine(x, y, G, eps=1e-12)
    assert dot.shape == cos.shape == plain.shape == (b, k, h)
    for bi in range(b):
        for j in range(k):
            for hi in range(h):
                px, py = x[bi, 0, hi] @ W_O[hi], y[bi, j, hi] @ W_O[hi]
                assert dot[bi, j, hi].item() == pytest.approx(float(px @ py), rel=1e-12, abs=1e-12)
                if (bi, j, hi) == (0, 2, 1):
                    assert torch.isnan(cos[bi, j, hi]) and torch.isnan(plain[bi, j, hi]) and cos_eps[bi, j, hi] == 0
                    continue
                assert cos[bi, j, hi].item() == pytest.approx(float(px @ py / (px.norm() * py.norm())), rel=1e-10)
                assert cos_eps[bi, j, hi].item() == pytest.approx(cos[bi, j, hi].item(), rel=1e-9)
                vx, vy = x[bi, 0, hi], y[bi, j, hi]
                assert plain[bi, j, hi].item() == pytest.approx(float(vx @ vy / (vx.norm() * vy.norm())), rel=1e-10)
    # G broadcast over other leading axes: [head, 1, 1, d, d] for [batch, head, query, key, d]
    z = y.permute(0, 2, 1, 3)[:, :, None]  # [b, h, 1, k, d]
    torch.testing.assert_close(
        geometry.gram_dot(z, z, G[:, None, None]), (geometry.gram_norm(y, G) ** 2).permute(0, 2, 1)[:, :, None]
    )


def test_projected_values_against_the_naive_reference(tiny):
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        naive = reference.projected_values(model, cache, layer)  # [b, h, k, d_model], loops in float64
        got = geolens.projected_values(model, cache, layer)  # [batch, pos, head, d_model]
        torch.testing.assert_close(got.double().transpose(1, 2), naive, atol=1e-5, rtol=1e-5)
        view = geolens.get_attention_layer(model, cache, layer)
        torch.testing.assert_close(geolens.projected_values(view), got, atol=0, rtol=0)
        torch.testing.assert_close(
            got.norm(dim=-1).transpose(1, 2), geolens.projected_value_norms(view), atol=1e-5, rtol=1e-5
        )
    with pytest.raises(TypeError, match="needs \\(model, cache, layer\\)"):
        geolens.projected_values(model, cache)
