"""The analyze command's per-layer summary against explicit projected values."""

from __future__ import annotations

import reference
import torch

import geolens
from geolens.commands.analyze import sink_summary, top_sources


def test_sink_summary_matches_materialised_values(tiny):
    model, _, cache = tiny
    got = sink_summary(geolens.get_attention_layer(model, cache, 1, dtype=torch.float64))
    vt = reference.projected_values(model, cache, 1)  # [b, h, k, dm]
    pattern, _, _ = reference.raw_tensors(model, cache, 1)
    norms = vt.norm(dim=-1)
    cos = torch.nn.functional.cosine_similarity(vt[:, :, :1], vt[:, :, 1:], dim=-1)
    assert abs(got["sink_rate"] - pattern[:, :, 1:, 0].mean().item()) < 1e-9
    assert abs(got["sink_norm_ratio"] - (norms[:, :, 0] / norms[:, :, 1:].mean(-1)).mean().item()) < 1e-9
    assert abs(got["sink_cosine"] - cos.mean().item()) < 1e-7


def test_top_sources_rank_by_each_score(tiny_gqa):
    model, tokens, cache = tiny_gqa
    view = geolens.get_attention_layer(model, cache, 1)
    (name_a, by_attn), (name_c, by_contrib) = top_sources(model, tokens[:1], view, k=3)
    assert name_a == "raw attention" and name_c == "contribution"
    attn = view.pattern[0, :, -1].mean(0)
    assert [j for j, _, _ in by_attn] == torch.argsort(attn, descending=True, stable=True)[:3].tolist()
    assert [v for _, _, v in by_contrib] == sorted((v for _, _, v in by_contrib), reverse=True)
