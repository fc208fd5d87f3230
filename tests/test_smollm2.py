"""Slow tier: the foundation on the real SmolLM2-135M (GQA, 9 query / 3 kv heads, no biases)."""

from __future__ import annotations

import pytest
import reference
import torch

import geolens
from geolens.adapter import attn_out_hook

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_cache(smollm2, smollm2_tokens):
    with torch.no_grad():
        _, cache = smollm2.run_with_cache(
            smollm2_tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_v", "hook_z", "attn.hook_out"))
        )
    return cache


def test_config_is_smollm2(smollm2):
    cfg = smollm2.cfg
    assert (cfg.n_layers, cfg.n_heads, geolens.adapter.n_kv_heads(smollm2), cfg.d_head) == (30, 9, 3, 64)
    assert geolens.adapter.model_mode(smollm2) == "bridge"


def test_reconstructs_attention_output_and_hook_z_every_layer(smollm2, smol_cache):
    for layer in range(smollm2.cfg.n_layers):
        view = geolens.get_attention_layer(smollm2, smol_cache, layer)
        torch.testing.assert_close(view.z, smol_cache[f"blocks.{layer}.attn.hook_z"], atol=1e-5, rtol=1e-4)
        out = geolens.layer_output(view) + view.b_O
        torch.testing.assert_close(out, smol_cache[attn_out_hook(smollm2, layer)], atol=1e-4, rtol=1e-4)


def test_sums_to_one_on_real_model(smollm2, smol_cache):
    intra = geolens.contribution_weights(smollm2, smol_cache, None, "intra")
    inter = geolens.contribution_weights(smollm2, smol_cache, None, "inter")
    torch.testing.assert_close(intra.sum(-1), torch.ones_like(intra.sum(-1)), atol=1e-5, rtol=0)
    totals = geolens.per_source_totals(inter).sum(-1)
    torch.testing.assert_close(totals, torch.ones_like(totals), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["intra", "inter"])
def test_matches_naive_reference_on_a_short_prompt(smollm2, mode):
    tokens = smollm2.to_tokens("The capital of France is Paris.", prepend_bos=True)
    with torch.no_grad():
        _, cache = smollm2.run_with_cache(tokens, names_filter=geolens.names_filter(smollm2, layers=[3]))
    got = geolens.contribution_weights(smollm2, cache, 3, mode, dtype=torch.float64)
    torch.testing.assert_close(got, reference.contributions(smollm2, cache, 3, mode), rtol=1e-7, atol=1e-9)


def test_sink_is_real_and_low_norm(smollm2, smol_cache):
    """docs/tl-notes.md: SmolLM2 shows real sinks in middle layers, with low sink projected-value norm."""
    view = geolens.get_attention_layer(smollm2, smol_cache, 15)
    norms = geolens.projected_value_norms(view)
    assert view.pattern[:, :, 1:, 0].mean() > 0.3
    assert (norms[:, :, 0] / norms[:, :, 1:].mean(-1)).mean() < 0.6


def test_analyze_command_prints_real_numbers(capsys):
    from geolens.cli import main

    assert main(["analyze", "The capital of France is Paris.", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "30 layers" in out and "by contribution" in out and "' Paris'" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:2].strip().isdigit() and len(line.split()) == 4]
    assert len(rows) == 30
