"""Sink geometry (docs/method.md §4, geolens.sinks.geometry) against naive float64 loops over
sequences, heads and positions with ṽ materialised (:mod:`reference`), over several batches so that
the streaming merge is exercised too."""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch
from conftest import make_tiny

from geolens.sinks import (
    SinkGeometry,
    sink_geometry,
)
from geolens.testing import tiny_tokens


def _cos(a, b):
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def test_sink_geometry_matches_naive_loops(corpus):
    model, tokens, cache = corpus
    res = sink_geometry(model, tokens, batch_size=2)  # batches of 2 and 1: merge exercised
    B, T = tokens.shape
    for layer in range(model.cfg.n_layers):
        pattern, v, _ = reference.raw_tensors(model, cache, layer)
        vt = reference.projected_values(model, cache, layer)  # [b, h, k, dm]
        for h in range(model.cfg.n_heads):
            row = res.heads[(res.heads.layer == layer) & (res.heads["head"] == h)].iloc[0]
            rates = [float(pattern[b, h, i, 0]) for b in range(B) for i in range(1, T)]
            gu = [sum(float(pattern[b, h, i, 0]) for i in range(T)) / T for b in range(B)]
            vr = [float(v[b, 0, h].norm()) / np.mean([float(v[b, j, h].norm()) for j in range(1, T)]) for b in range(B)]
            pr = [
                float(vt[b, h, 0].norm()) / np.mean([float(vt[b, h, j].norm()) for j in range(1, T)]) for b in range(B)
            ]
            vc = [_cos(v[b, 0, h], v[b, j, h]) for b in range(B) for j in range(1, T)]
            pc = [_cos(vt[b, h, 0], vt[b, h, j]) for b in range(B) for j in range(1, T)]
            vm = [_cos(v[b, 0, h], sum(v[b, j, h] for j in range(1, T)) / (T - 1)) for b in range(B)]
            pm = [_cos(vt[b, h, 0], sum(vt[b, h, j] for j in range(1, T)) / (T - 1)) for b in range(B)]
            expected = {
                "sink_rate": np.mean(rates),
                "sink_rate_std": np.std(rates, ddof=1),
                "gu_score": np.mean(gu),
                "gu_sink_share": np.mean([g > 0.3 for g in gu]),
                "value_norm_ratio": np.mean(vr),
                "proj_norm_ratio": np.mean(pr),
                "value_cos_tail": np.mean(vc),
                "proj_cos_tail": np.mean(pc),
                "value_cos_negative": np.mean([c < 0 for c in vc]),
                "proj_cos_negative": np.mean([c < 0 for c in pc]),
                "value_cos_mean_dir": np.mean(vm),
                "proj_cos_mean_dir": np.mean(pm),
            }
            for key, value in expected.items():
                assert row[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (layer, h, key)
            assert row.kv_head == h // (model.cfg.n_heads // cache[f"blocks.{layer}.attn.hook_v"].shape[2])
            hist = res.sink_rate_hist[(res.sink_rate_hist.layer == layer) & (res.sink_rate_hist["head"] == h)]
            naive = np.histogram(rates, bins=np.linspace(0, 1, 21))[0]
            assert hist["count"].tolist() == naive.tolist()
    assert res.layers.shape[0] == model.cfg.n_layers
    assert res.gu_sink_rate == pytest.approx(res.heads.gu_sink_share.mean())


def test_gu_threshold_is_a_parameter(corpus):
    model, tokens, _ = corpus
    low = sink_geometry(model, tokens, eps=0.0)
    high = sink_geometry(model, tokens, eps=1.0)
    assert low.gu_sink_rate == 1.0 and high.gu_sink_rate == 0.0


def test_sink_geometry_state_round_trip_and_merge(corpus, whole_and_parts):
    model, tokens, _ = corpus
    whole, a, b = whole_and_parts(model, tokens, SinkGeometry, split=1, batch_size=1)
    restored = SinkGeometry(model.cfg.n_layers, model.cfg.n_heads).load_state_dict(a.state_dict())
    restored.merge(b)
    x, y = whole.result().heads, restored.result().heads
    assert np.allclose(
        x.drop(columns=["sink_rate_std"]).to_numpy(float),
        y.drop(columns=["sink_rate_std"]).to_numpy(float),
        equal_nan=True,
    )


def test_padded_or_too_short_input_is_refused():
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, length=1)
    with pytest.raises(ValueError, match="at least 2"):
        sink_geometry(model, tokens)
