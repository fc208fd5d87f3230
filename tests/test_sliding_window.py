"""Sliding-window (local) attention layers: every analysis uses the true visible set T_i.

A tiny Gemma 3 (layer 0 local with W = 16, layer 1 global) on 40-token windows, so queries
16 … 39 of layer 0 cannot see the sink. Each quantity is checked against explicit float64 loops
that apply the window literally.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import reference
import selection_reference as ref
import torch
from conftest import HAS_BRIDGE, make_tiny

import geolens
from geolens.adapter import sliding_window
from geolens.runner import run_corpus
from geolens.selection.scores import head_selection_scores, layer_contributions
from geolens.sinks import sink_geometry, token_type_decomposition
from geolens.sinks.drift import head_drift_statistics
from geolens.sinks.norm_curve import NormCurve
from geolens.testing import tiny_tokens
from geolens.visibility import visible_keys

T, W = 40, 16

pytestmark = pytest.mark.bridge_only  # the tiny Gemma 3 exists only as a TransformerBridge


@pytest.fixture(scope="module")
def gemma():
    if not HAS_BRIDGE:
        pytest.skip("needs TransformerLens 4.x")
    model = make_tiny("gemma")
    windows = [sliding_window(model, l) for l in range(model.cfg.n_layers)]
    assert windows == [W, None], windows
    tokens = tiny_tokens(model, length=T)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    return model, tokens, cache, windows


def lo(i, window):
    return 0 if window is None else max(0, i - window + 1)


def test_the_model_really_masks_outside_the_window(gemma):
    model, tokens, cache, _ = gemma
    p = cache["blocks.0.attn.hook_pattern"]
    outside = ~visible_keys(T, T, W)
    assert float(p.masked_select(outside.expand_as(p)).abs().max()) == 0.0
    assert float(p[:, :, W:, 0].abs().max()) == 0.0  # queries ≥ W give the (invisible) sink exactly 0


def _cos(a, b):
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def test_sink_geometry_uses_the_visible_set(gemma):
    model, tokens, cache, windows = gemma
    res = sink_geometry(model, tokens, batch_size=tokens.shape[0])
    B = tokens.shape[0]
    for layer, w in enumerate(windows):
        pattern, v, _ = reference.raw_tensors(model, cache, layer)
        vt = reference.projected_values(model, cache, layer)
        seen = [i for i in range(T) if lo(i, w) == 0]  # queries that see the sink
        tail = [j for j in range(1, T) if w is None or j < w]  # keys sharing a window with the sink
        for h in range(model.cfg.n_heads):
            row = res.heads[(res.heads.layer == layer) & (res.heads["head"] == h)].iloc[0]
            rates = [float(pattern[b, h, i, 0]) for b in range(B) for i in seen if i >= 1]
            gu = [sum(float(pattern[b, h, i, 0]) for i in seen) / len(seen) for b in range(B)]
            vr = [float(v[b, 0, h].norm()) / np.mean([float(v[b, j, h].norm()) for j in tail]) for b in range(B)]
            pr = [float(vt[b, h, 0].norm()) / np.mean([float(vt[b, h, j].norm()) for j in tail]) for b in range(B)]
            vc = [_cos(v[b, 0, h], v[b, j, h]) for b in range(B) for j in tail]
            pc = [_cos(vt[b, h, 0], vt[b, h, j]) for b in range(B) for j in tail]
            vm = [_cos(v[b, 0, h], sum(v[b, j, h] for j in tail) / len(tail)) for b in range(B)]
            expected = {
                "sink_rate": np.mean(rates),
                "gu_score": np.mean(gu),
                "value_norm_ratio": np.mean(vr),
                "proj_norm_ratio": np.mean(pr),
                "value_cos_tail": np.mean(vc),
                "proj_cos_tail": np.mean(pc),
                "value_cos_negative": np.mean([c < 0 for c in vc]),
                "value_cos_mean_dir": np.mean(vm),
            }
            for key, value in expected.items():
                assert row[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (layer, h, key)
            assert row.n_queries == len(rates)
            assert row.n_out_of_window == B * (T - len(seen))
            assert (row.window == w) if w is not None else (row.window is None or math.isnan(row.window))
            hist = res.sink_rate_hist[(res.sink_rate_hist.layer == layer) & (res.sink_rate_hist["head"] == h)]
            assert hist["count"].sum() == len(rates)  # no out-of-window query in the α = 0 bin
    assert (res.heads[res.heads.layer == 0].n_out_of_window == B * (T - W)).all()


def test_norm_curve_leaves_out_of_window_queries_out(gemma):
    model, tokens, cache, windows = gemma
    nc = NormCurve(model.cfg.n_layers, model.cfg.n_heads)
    run_corpus(model, tokens, [nc], batch_size=tokens.shape[0], progress=False)
    res = nc.result()
    B = tokens.shape[0]
    assert res.n_out_of_window == {0: B * (T - W), 1: 0}
    pattern, _, _ = reference.raw_tensors(model, cache, 0)
    for h in range(model.cfg.n_heads):
        rates = [float(pattern[b, h, i, 0]) for b in range(B) for i in range(1, W)]
        naive = np.histogram(rates, bins=np.linspace(0, 1, 21))[0]
        got = res.curves[(res.curves.scope == "head") & (res.curves.layer == 0) & (res.curves["head"] == h)]["count"]
        assert got.tolist() == naive.tolist()


def test_token_type_decomposition_counts_visible_pairs_only(gemma):
    model, tokens, cache, windows = gemma
    res = token_type_decomposition(model, tokens, batch_size=tokens.shape[0])
    B = tokens.shape[0]
    for layer, w in enumerate(windows):
        c = geolens.contribution_weights(model, cache, layer, mode="intra", dtype=torch.float64)
        for h in range(model.cfg.n_heads):
            sink_n = sum(1 for b in range(B) for i in range(1, T) if lo(i, w) == 0 and c[b, h, i, 0] != 0)
            tail_n = sum(
                1 for b in range(B) for i in range(1, T) for j in range(max(1, lo(i, w)), i + 1) if c[b, h, i, j] != 0
            )
            got = res.heads[(res.heads.layer == layer) & (res.heads["head"] == h)].set_index("source")["n"]
            assert got["sink"] == sink_n and got["tail"] == tail_n, (layer, h)
    assert res.heads[(res.heads.layer == 0) & (res.heads.source == "sink")].n.max() <= B * (W - 1)


def test_drift_statistics_skip_queries_the_edit_cannot_reach(gemma):
    model, tokens, cache, windows = gemma
    layer = geolens.get_attention_layer(model, cache, 0, dtype=torch.float64)
    norm, cos, vnorm = head_drift_statistics(layer, window=W)
    B, H = tokens.shape[0], model.cfg.n_heads
    norm, cos, vnorm = norm.reshape(B, T - 1, H), cos.reshape(B, T - 1, H), vnorm.reshape(B, T - 1, H)
    assert (
        torch.isnan(norm[:, W - 1 :]).all()
        and torch.isnan(cos[:, W - 1 :]).all()
        and not torch.isnan(norm[:, : W - 1]).any()
    )
    assert torch.isnan(vnorm[:, W - 1 :]).all()
    full_norm, full_cos, _ = head_drift_statistics(layer)
    # in-window queries: unchanged (their visible non-sink tokens are 1 … i anyway)
    torch.testing.assert_close(norm[:, : W - 1], full_norm.reshape(B, T - 1, H)[:, : W - 1])
    torch.testing.assert_close(cos[:, : W - 1], full_cos.reshape(B, T - 1, H)[:, : W - 1])
    vt = reference.projected_values(model, cache, 0)
    pattern, _, _ = reference.raw_tensors(model, cache, 0)
    for b, h, i in [(0, 0, 3), (1, 3, 15)]:
        o = sum(pattern[b, h, i, j] * vt[b, h, j] for j in range(i + 1))
        m = sum(vt[b, h, j] for j in range(1, i + 1)) / i
        assert float(norm[b, i - 1, h]) == pytest.approx(float(o.norm()), rel=1e-6)
        assert float(cos[b, i - 1, h]) == pytest.approx(_cos(o, m), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("kind", ["euclidean", "cosine"])
def test_selection_scores_use_the_window(gemma, kind):
    model, tokens, cache, windows = gemma
    layer = geolens.get_attention_layer(model, cache, 0, dtype=torch.float64)
    pattern, v, _ = reference.raw_tensors(model, cache, 0)
    _, visible = layer_contributions(layer, slice(30, 40), window=W)
    assert visible.tolist() == visible_keys(T, T, W)[30:40].tolist()
    sizes = [1, 2, 4, 8, 16]
    for by, sink in itertools.product(("attention", "norm"), ("keep", "force")):
        sep = head_selection_scores(layer, sizes, distance=kind, by=by, sink=sink, queries="all", window=W)
        for b, h, i in [(0, 0, 5), (1, 2, 20), (0, 3, 39)]:
            ys = [(pattern[b, h, i, j] * v[b, j, h]).tolist() for j in range(T)]
            ranks = [
                float(pattern[b, h, i, j]) if by == "attention" else float(torch.tensor(ys[j]).norm()) for j in range(T)
            ]
            vis = [lo(i, W) <= j <= i for j in range(T)]
            for k, n in enumerate(sizes):
                want, _, S = ref.scores(ys, ranks, vis, n, kind, sink)
                if i >= W:
                    assert 0 not in S  # an invisible sink is never selected, even when forced
                if want is None:
                    assert math.isnan(float(sep.f[b, h, i, k])), (by, sink, i, n)
                    continue
                for f in ("precision", "recall", "f"):
                    assert float(getattr(sep, f)[b, h, i, k]) == pytest.approx(want[f], abs=1e-6), (f, by, sink, i, n)


def test_selection_analysis_sink_share_ignores_queries_without_sink(gemma):
    from geolens.selection.analysis import Condition, SelectionAnalysis

    model, tokens, cache, windows = gemma
    conds = (
        Condition("value", "euclidean", "attention", "keep", random=False),
        Condition("value", "euclidean", "attention", "force", random=False),
    )
    a = SelectionAnalysis(model.cfg.n_layers, model.cfg.n_heads, [1, 2, 4], conditions=conds, queries="all")
    a.update(model, cache, tokens)
    B, H = tokens.shape[0], model.cfg.n_heads
    # force: the sink is in the top-N set of exactly the queries that see it (layer 0: i < 16; layer 1: all)
    forced = a.sink_in_top[conds[1].name]
    assert forced.count.tolist() == [B * H * (W + T)] * 3 and forced.mean.tolist() == [1.0] * 3
    kept = a.sink_in_top[conds[0].name]
    assert kept.count.tolist() == [B * H * (W + T)] * 3


def test_report_contrast_leaves_the_invisible_sink_out(gemma):
    from geolens.report import ContributionContrast

    model, tokens, cache, windows = gemma
    cc = ContributionContrast.for_model(model)
    cc.update(model, cache, tokens)
    B = tokens.shape[0]
    pattern, _, _ = reference.raw_tensors(model, cache, 0)
    c = geolens.contribution_weights(model, cache, 0, mode="intra", dtype=torch.float64)
    for h in range(model.cfg.n_heads):
        assert cc.sink_attention.count[0, h] == B * (W - 1) and cc.sink_attention.count[1, h] == B * (T - 1)
        rates = [float(pattern[b, h, i, 0]) for b in range(B) for i in range(1, W)]
        assert float(cc.sink_attention.mean[0, h]) == pytest.approx(np.mean(rates), rel=1e-5)
        neg = [
            sum(float(c[b, h, i, j]) < 0 for j in range(lo(i, W), i + 1)) / (i + 1 - lo(i, W))
            for b in range(B)
            for i in range(1, T)
        ]
        assert float(cc.negative_share.mean[0, h]) == pytest.approx(np.mean(neg), abs=1e-6)


def test_regime_uses_the_sink_window_and_fits_visible_lags(gemma):
    from geolens.selection.regime import RegimeAnalysis, fit_exponential_decay, window_regime

    model, tokens, cache, windows = gemma
    layer = geolens.get_attention_layer(model, cache, 0, dtype=torch.float64)
    got = window_regime(layer, window=W)
    _, v, _ = reference.raw_tensors(model, cache, 0)
    for b, h in [(0, 0), (1, 3)]:
        ratio = float(v[b, 0, h].norm()) / np.mean([float(v[b, j, h].norm()) for j in range(1, W)])
        align = np.mean([_cos(v[b, 0, h], v[b, j, h]) for j in range(1, W)])
        assert float(got["sink_norm_ratio"][b, h]) == pytest.approx(ratio, rel=1e-6)
        assert float(got["sink_alignment"][b, h]) == pytest.approx(align, rel=1e-6, abs=1e-9)
    ra = RegimeAnalysis.for_model(model, T)
    run_corpus(model, tokens, [ra], batch_size=tokens.shape[0], progress=False)
    res = ra.result()
    prof = res["profile"]
    assert np.isnan(prof[0, :, W:]).all() and not np.isnan(prof[0, :, :W]).any() and not np.isnan(prof[1]).any()
    np.testing.assert_allclose(prof[0, :, :W].sum(-1), 1.0, atol=1e-5)  # the window holds all the attention
    fit0 = fit_exponential_decay(res["lag_sim"][0, :, : W - 1])
    fit1 = fit_exponential_decay(res["lag_sim"][1])
    heads = res["heads"]
    np.testing.assert_allclose(heads[heads.layer == 0].decay_length.to_numpy(), fit0["length"])
    np.testing.assert_allclose(heads[heads.layer == 1].decay_length.to_numpy(), fit1["length"])
