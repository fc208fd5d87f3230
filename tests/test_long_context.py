"""Long context: a memory budget picks the query chunk; results are identical, and the
extra memory beyond inputs and outputs stays within the budget."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import geolens
from geolens.contributions import contribution_weights_from_layer
from geolens.geometry import iter_query_chunks, query_chunk_for_budget

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the probe lives with the benchmarks
from long_context_probe import measure_in_subprocess  # noqa: E402

LONG = 4096


def long_model():
    """A one-layer tiny GQA model whose context holds 4096 tokens (bridge or HookedTransformer)."""
    try:
        from geolens.adapter.bridge import transformer_bridge
        from geolens.testing import tiny_hf_model, tiny_tokenizer

        hf = tiny_hf_model("gqa", n_ctx=LONG, n_layers=1)
        return transformer_bridge("geolens-tiny-long", hf, tiny_tokenizer(), compatibility_mode=False, device="cpu")
    except ImportError:
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        from geolens.testing import tiny_tokenizer

        cfg = HookedTransformerConfig(
            n_layers=1,
            d_model=32,
            n_heads=4,
            d_head=8,
            d_mlp=64,
            d_vocab=64,
            n_ctx=LONG,
            seed=0,
            n_key_value_heads=2,
            act_fn="silu",
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_dim=8,
            gated_mlp=True,
        )
        return HookedTransformer(cfg, tokenizer=tiny_tokenizer()).eval()


@pytest.fixture(scope="module")
def long_cache():
    model = long_model()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 40, (1, LONG), generator=g)
    tokens[:, 0] = 0
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    return model, cache


@pytest.mark.parametrize("mode", ["intra", "inter"])
def test_4096_tokens_budgeted_contributions_identical_to_unchunked(long_cache, mode):
    model, cache = long_cache
    full = geolens.contribution_weights(model, cache, 0, mode)
    budget = 16 * 2**20
    chunked = geolens.contribution_weights(model, cache, 0, mode, memory_budget_bytes=budget)
    assert torch.equal(chunked, full)
    view = geolens.get_attention_layer(model, cache, 0)
    chunk = query_chunk_for_budget(view, budget)
    assert chunk == budget // (4 * LONG * 4 * 3) < LONG  # really chunked: 85 queries at a time
    # streaming reduction over chunks never holds [head, query, key]: per-source totals of c
    streamed = torch.zeros(1, 4, LONG, dtype=torch.float64)
    for queries, sub in iter_query_chunks(view, memory_budget_bytes=budget):
        streamed += contribution_weights_from_layer(sub, mode).double().sum(2)
    torch.testing.assert_close(streamed, full.double().sum(2), rtol=1e-9, atol=1e-9)


def test_4096_tokens_budgeted_metrics_identical(long_cache):
    model, cache = long_cache
    full = geolens.attention_metrics(model, cache, 0, "intra")
    chunked = geolens.attention_metrics(model, cache, 0, "intra", memory_budget_bytes=24 * 2**20)
    for name in full.METRIC_NAMES:
        assert torch.equal(getattr(chunked, name), getattr(full, name)), name


def test_budget_errors_name_the_problem(tiny_gqa):
    model, _, cache = tiny_gqa
    with pytest.raises(ValueError, match="below the .* bytes that one query row needs"):
        geolens.contribution_weights(model, cache, 0, memory_budget_bytes=10)
    with pytest.raises(ValueError, match="either query_chunk_size or memory_budget_bytes"):
        geolens.contribution_weights(model, cache, 0, query_chunk_size=2, memory_budget_bytes=10**6)
    view = geolens.get_attention_layer(model, cache, 0)
    assert query_chunk_for_budget(view, 10**12) == view.pattern.shape[2]  # never more than the queries


def test_peak_extra_memory_stays_within_budget():
    """RSS sampled every ms in a fresh process (large allocations mmapped, so frees leave RSS).

    Outputs are counted apart: contribution weights return one ``[b, h, q, k]`` tensor, metrics
    three new ones (α is the pattern). Beyond them the budgeted runs stay within the budget plus
    a fixed allowance (allocator and thread slack), while unchunked metrics exceed it.
    """
    budget, slack = 16 * 2**20, 12 * 2**20
    r = measure_in_subprocess(LONG, budget, timeout=300)
    out = r["pattern_bytes"]  # 256 MiB: one [1, 4, 4096, 4096] float32 tensor
    assert r["cw_budget"] - out <= budget + slack, r
    assert r["metrics_budget"] - 3 * out <= budget + slack, r
    assert r["streamed"] <= budget + slack, r  # no [b, h, q, k] output at all
    assert r["metrics_full"] - 3 * out > 2 * (budget + slack), r  # the unchunked form does not fit
