"""Slow tier: the sink analyses and interventions on the real SmolLM2-135M (GQA, 9 heads / 3 kv)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geolens.adapter import attn_out_hook, hook_name
from geolens.interventions import active_hook_count, applied
from geolens.interventions.sink_values import PartialKVGroupError, scale_sink_value, scale_sink_value_hooks
from geolens.sinks import output_norm_curve, semantic_drift, sink_geometry, token_type_decomposition

pytestmark = pytest.mark.slow


def test_sink_geometry_on_smollm2_matches_explicit_projected_values(smollm2, smollm2_tokens):
    model, tokens = smollm2, smollm2_tokens[:2, :32]
    layer = 6
    res = sink_geometry(model, tokens, layers=[layer])
    assert len(res.heads) == 9 and res.heads.kv_head.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # GQA: the value-space numbers of the three query heads of a group coincide
    for _, g in res.heads.groupby("kv_head"):
        assert np.ptp(g.value_norm_ratio.to_numpy()) < 1e-9
    names = [hook_name(layer, "attn.hook_pattern"), hook_name(layer, "attn.hook_v")]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    pattern, v = cache[names[0]].double(), cache[names[1]].double()
    W_O = model.blocks[layer].attn.W_O.detach().double()
    if W_O.ndim == 2:
        W_O = W_O.T.reshape(9, 64, -1)
    for h in (0, 4, 8):
        vt = v[:, :, h // 3] @ W_O[h]  # explicit ṽ [b, k, d_model]
        ratios = [float(vt[b, 0].norm() / vt[b, 1:].norm(dim=-1).mean()) for b in range(2)]
        cos = torch.nn.functional.cosine_similarity(vt[:, :1], vt[:, 1:], dim=-1)
        row = res.heads[res.heads["head"] == h].iloc[0]
        assert row.proj_norm_ratio == pytest.approx(np.mean(ratios), rel=1e-6)
        assert row.proj_cos_tail == pytest.approx(float(cos.mean()), rel=1e-6, abs=1e-9)
        assert row.sink_rate == pytest.approx(float(pattern[:, h, 1:, 0].mean()), rel=1e-9)


def test_sink_value_removal_identity_on_smollm2(smollm2, smollm2_tokens):
    model, tokens = smollm2, smollm2_tokens[:2, :32]
    layer = 4
    names = [hook_name(layer, "attn.hook_pattern"), hook_name(layer, "attn.hook_v"), attn_out_hook(model, layer)]
    before = active_hook_count(model)
    with torch.no_grad():
        logits, base = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        same = model.run_with_hooks(tokens, fwd_hooks=scale_sink_value_hooks(model, 1.0))
        with applied(model, scale_sink_value(model, 0.0, layers=[layer], kv_heads=[1]).fwd_hooks):
            _, edited = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    assert torch.equal(logits, same)
    assert active_hook_count(model) == before
    pattern, v = base[names[0]].double(), base[names[1]].double()
    W_O = model.blocks[layer].attn.W_O.detach().double()
    if W_O.ndim == 2:
        W_O = W_O.T.reshape(9, 64, -1)
    masked = pattern.clone()
    masked[:, 3:6, :, 0] = 0  # kv head 1 feeds query heads 3, 4, 5
    expected = sum(torch.einsum("bqk,bkm->bqm", masked[:, h], v[:, :, h // 3] @ W_O[h]) for h in range(9))
    torch.testing.assert_close(edited[names[2]].double(), expected, atol=2e-4, rtol=1e-4)
    with pytest.raises(PartialKVGroupError):
        scale_sink_value(model, 0.0, heads=[3, 4])


def test_decomposition_and_norm_curve_on_smollm2(smollm2, smollm2_tokens):
    model, tokens = smollm2, smollm2_tokens[:4, :48]
    dec = token_type_decomposition(model, tokens, layers=[3, 12])
    shares = dec.layers[["share_attention", "share_relnorm", "share_cosine"]].sum(axis=1)
    np.testing.assert_allclose(shares, 1.0, atol=1e-8)
    assert (dec.layers[dec.layers.source == "sink"].n > 0).all()
    curve = output_norm_curve(model, tokens, layers=[3, 12], min_count=5)
    layer_curves = curve.curves[curve.curves.scope == "layer"]
    assert layer_curves.groupby("layer")["count"].sum().tolist() == [4 * 47 * 9] * 2
    assert set(curve.fits.scope) == {"head", "layer"}


def test_semantic_drift_on_smollm2(smollm2, smollm2_tokens):
    model, tokens = smollm2, smollm2_tokens[:2, :48]
    res = semantic_drift(model, tokens, lambdas=[0.0], layers=[2, 3], kv_heads=[0])
    assert res.edited["query_heads"] == [0, 1, 2]
    s = res.summary.set_index("lambda")
    with torch.no_grad():
        loss = float(model(tokens, return_type="loss"))
    assert s.loc[1.0, "nll"] == pytest.approx(loss, rel=1e-4)
    assert s.loc[1.0, "delta_ppl"] == 0.0
    assert res.heads.cos_cone.between(-1, 1).all()
    assert len(res.heads) == 2 * 2 * 3  # (λ = 0, 1) × layers × query heads of kv head 0
