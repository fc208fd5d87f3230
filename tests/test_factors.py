"""Influence factors and attention metrics (geolens.factors): the relative norm and the alignment
against the naive float64 reference (tests/reference.py) and multiplying to the contribution weight;
the metrics share one shape and are built from the attention, the value norms and the head outputs
as defined, chunked queries or not."""

from __future__ import annotations

import pytest
import reference
import torch

import geolens

MODES = ["intra", "inter"]


@pytest.mark.parametrize("mode", MODES)
def test_factors_match_naive_reference_and_multiply_to_c(tiny, mode):
    model, _, cache = tiny
    f = geolens.influence_factors(model, cache, 1, mode, dtype=torch.float64)
    rel, cos = reference.factors(model, cache, 1, mode)
    torch.testing.assert_close(f.relative_norm, rel, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(f.alignment, cos, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(f.contribution, reference.contributions(model, cache, 1, mode), rtol=1e-8, atol=1e-10)
    assert f.mode == mode and f.model_mode == geolens.adapter.model_mode(model)


def test_metrics_same_shape_and_baselines(tiny):
    model, _, cache = tiny
    m = geolens.attention_metrics(model, cache, 1)
    shapes = {name: tuple(t.shape) for name, t in m.as_dict().items()}
    assert len(set(shapes.values())) == 1
    norms = geolens.projected_value_norms(geolens.get_attention_layer(model, cache, 1))
    torch.testing.assert_close(m.value_weighted, m.raw_attention * norms[:, :, None, :])
    out_norm = geolens.head_outputs(geolens.get_attention_layer(model, cache, 1)).norm(dim=-1)  # [b,q,h]
    torch.testing.assert_close(
        m.output_normalized, m.value_weighted / out_norm.permute(0, 2, 1)[..., None], rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(m.contribution, geolens.contribution_weights(model, cache, 1))


@pytest.mark.parametrize("mode", MODES)
def test_query_chunking_is_identical(tiny, mode):
    model, _, cache = tiny
    full = geolens.attention_metrics(model, cache, 0, mode)
    chunked = geolens.attention_metrics(model, cache, 0, mode, query_chunk_size=5)
    for name in full.METRIC_NAMES:
        torch.testing.assert_close(getattr(chunked, name), getattr(full, name), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        geolens.contribution_weights(model, cache, 0, mode, query_chunk_size=3),
        geolens.contribution_weights(model, cache, 0, mode),
        rtol=0,
        atol=1e-6,
    )
