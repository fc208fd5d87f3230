"""Property-based tests (hypothesis) of the contribution engine's invariants over random shapes,
grouped-query layouts, paddings and chunk sizes:

- intra-head rows sum to 1; inter-head weights sum to 1 over (head, source);
- Σ_j α_ij ṽ_j summed over heads reconstructs the attention output Σ_h z^h W_O^h;
- chunked equals unchunked;
- padded (with ``attention_mask``) equals unpadded, and padded positions are 0.

The "model" is a minimal stand-in (config + W_O), so thousands of shapes run in seconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from geolens import attention_metrics, contribution_weights  # noqa: E402
from geolens.adapter import get_attention_layer  # noqa: E402
from geolens.geometry import layer_output  # noqa: E402


def _model(n_heads, n_kv, d_head, d_model, seed):
    g = torch.Generator().manual_seed(seed)
    W_O = torch.randn(n_heads, d_head, d_model, generator=g, dtype=torch.float64)
    cfg = SimpleNamespace(n_layers=1, n_heads=n_heads, n_key_value_heads=n_kv, d_head=d_head, d_model=d_model)
    return SimpleNamespace(cfg=cfg, blocks=[SimpleNamespace(attn=SimpleNamespace(W_O=W_O, b_O=None))])


def _cache(batch, n_heads, n_kv, d_head, n, seed):
    g = torch.Generator().manual_seed(seed + 1)
    logits = torch.randn(batch, n_heads, n, n, generator=g, dtype=torch.float64) * 2
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    pattern = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    v = torch.randn(batch, n, n_kv, d_head, generator=g, dtype=torch.float64)
    return {"blocks.0.attn.hook_pattern": pattern, "blocks.0.attn.hook_v": v}


shapes = st.fixed_dictionaries(
    {
        "batch": st.integers(1, 3),
        "n_kv": st.integers(1, 3),
        "group": st.integers(1, 3),
        "d_head": st.integers(1, 6),
        "d_model": st.integers(2, 10),
        "n": st.integers(1, 12),
        "seed": st.integers(0, 10_000),
    }
)


def _setup(s):
    n_heads = s["n_kv"] * s["group"]
    model = _model(n_heads, s["n_kv"], s["d_head"], s["d_model"], s["seed"])
    cache = _cache(s["batch"], n_heads, s["n_kv"], s["d_head"], s["n"], s["seed"])
    return model, cache


@settings(max_examples=150, deadline=None)
@given(shapes)
def test_sums_to_one_and_reconstruction(s):
    model, cache = _setup(s)
    intra = contribution_weights(model, cache, 0, "intra", dtype=torch.float64)
    inter = contribution_weights(model, cache, 0, "inter", dtype=torch.float64)
    layer = get_attention_layer(model, cache, 0, dtype=torch.float64)
    # Σ_h Σ_j α_ij ṽ_j^h, with ṽ materialised
    vt = torch.einsum("bkhd,hdm->bhkm", layer.v, layer.W_O)
    recon = torch.einsum("bhqk,bhkm->bqm", layer.pattern, vt)
    torch.testing.assert_close(recon, layer_output(layer))
    head_norm = torch.einsum("bhqk,bhkm->bhqm", layer.pattern, vt).norm(dim=-1)
    live = head_norm > 1e-6
    torch.testing.assert_close(intra.sum(-1)[live], torch.ones(int(live.sum()), dtype=torch.float64))
    layer_live = layer_output(layer).norm(dim=-1) > 1e-6
    torch.testing.assert_close(inter.sum((1, 3))[layer_live], torch.ones(int(layer_live.sum()), dtype=torch.float64))


@settings(max_examples=100, deadline=None)
@given(shapes, st.integers(1, 12), st.sampled_from(["intra", "inter"]))
def test_chunked_equals_unchunked(s, chunk, mode):
    model, cache = _setup(s)
    full = attention_metrics(model, cache, 0, mode, dtype=torch.float64)
    part = attention_metrics(model, cache, 0, mode, dtype=torch.float64, query_chunk_size=chunk)
    for name, value in full.as_dict().items():
        torch.testing.assert_close(getattr(part, name), value, msg=name)
    c = contribution_weights(model, cache, 0, mode, dtype=torch.float64, query_chunk_size=chunk)
    torch.testing.assert_close(c, full.contribution)


@settings(max_examples=100, deadline=None)
@given(
    shapes,
    st.lists(st.integers(0, 11), min_size=3, max_size=3),
    st.sampled_from(["left", "right"]),
    st.sampled_from(["intra", "inter"]),
)
def test_padded_equals_unpadded(s, pads, side, mode):
    """Row r keeps the causal prefix of its first n − pads[r] tokens (its own unpadded result is
    the same prefix of the full one) and is padded back to n on the left or right, with garbage α
    and v at the pads: the real block equals the unpadded result, every padded position is 0."""
    model, cache = _setup(s)
    pattern, v = cache["blocks.0.attn.hook_pattern"], cache["blocks.0.attn.hook_v"]
    b, h, n, _ = pattern.shape
    g = torch.Generator().manual_seed(s["seed"] + 7)
    padded_p = torch.rand(b, h, n, n, generator=g, dtype=torch.float64)
    padded_v = torch.randn(b, n, v.shape[2], v.shape[3], generator=g, dtype=torch.float64)
    mask = torch.zeros(b, n, dtype=torch.long)
    blocks = []
    for row in range(b):
        length = max(1, n - pads[row])
        start = n - length if side == "left" else 0
        real = slice(start, start + length)
        blocks.append((real, length))
        mask[row, real] = 1
        padded_p[row][:, real, :] = 0  # real queries give exactly 0 to pad keys …
        padded_p[row][:, real, real] = pattern[row, :, :length, :length]  # … and their true attention to real ones
        padded_v[row, real] = v[row, :length]
    padded = {"blocks.0.attn.hook_pattern": padded_p, "blocks.0.attn.hook_v": padded_v}
    ref = attention_metrics(model, cache, 0, "intra", dtype=torch.float64).as_dict()
    got = attention_metrics(model, padded, 0, "intra", dtype=torch.float64, attention_mask=mask).as_dict()
    c_ref = contribution_weights(model, cache, 0, mode, dtype=torch.float64)
    c_got = contribution_weights(model, padded, 0, mode, dtype=torch.float64, attention_mask=mask)
    if mode == "inter":  # the layer output of a prefix equals the full one's prefix too
        ref, got = {"contribution": c_ref}, {"contribution": c_got}
    for name in ref:
        for row, (real, length) in enumerate(blocks):
            torch.testing.assert_close(got[name][row][:, real, real], ref[name][row][:, :length, :length], msg=name)
            pad = ~mask[row].bool()
            assert bool((got[name][row][:, pad] == 0).all()) and bool((got[name][row][:, :, pad] == 0).all()), name
