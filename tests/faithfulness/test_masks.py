"""Removal masks of the faithfulness curves (geolens.faithfulness.masks): the layout of curve_masks,
metric scores per ranking scope against naive references, and the intra-mode query scope."""

from __future__ import annotations

import pytest
import reference
import torch

from geolens.faithfulness import (
    MaskingConfig,
    curve_masks,
    faithfulness_curves,
    metric_scores,
)


def test_curve_masks_layout(tiny_gqa):
    model, tokens, _ = tiny_gqa
    protocol = MaskingConfig(layers=(0, 1), ranking="row", allow_sink=False, allow_current=False, fractions=(0.2, 0.6))
    scores = metric_scores(model, tokens[:1], protocol, ["raw_attention", "value_zeroing"])
    assert scores["raw_attention"].shape == (2, 1, model.cfg.n_heads, 12, 12)
    assert scores["value_zeroing"].shape == (2, 1, 1, 12, 12)
    masks = curve_masks(scores["raw_attention"], protocol)
    assert masks.shape == (2, 4, model.cfg.n_heads, 12, 12)
    # comprehensiveness and sufficiency at the same k remove the same number of sources
    assert torch.equal(masks[:, 0].sum((-1, -2)), masks[:, 2].sum((-1, -2)))
    assert not masks[..., 0].any()  # the sink is protected in this protocol
    assert not masks.diagonal(dim1=-2, dim2=-1).any()  # so is the current token
    primary = MaskingConfig(fractions=(0.9,))
    raw = metric_scores(model, tokens[:1], primary, ["raw_attention"])["raw_attention"]
    assert curve_masks(raw, primary)[:, 0, :, :, 0].any()  # the primary protocol may remove the sink


def naive_metric(model, cache, layer, metric, mode):
    """[head, q, k] float64 scores of one sequence from the explicit-loop references."""
    pattern, _, _ = reference.raw_tensors(model, cache, layer)
    vt = reference.projected_values(model, cache, layer)  # [b, h, k, dm]
    alpha = pattern[0]
    if metric == "raw_attention":
        return alpha
    vnorm = vt[0].norm(dim=-1)[:, None, :]
    if metric == "value_weighted":
        return alpha * vnorm
    if metric == "output_normalized":
        rel, _ = reference.factors(model, cache, layer, mode)
        return alpha * rel[0]
    c = reference.contributions(model, cache, layer, mode)[0]
    return c.abs() if metric == "contribution_abs" else c


@pytest.mark.parametrize("scope", ["query", "source"])
@pytest.mark.parametrize("mode", ["inter", "intra"])
def test_scoped_metric_scores_match_naive(tiny, scope, mode):
    model, tokens, cache = tiny
    seq = tokens[:1]
    layers = (0, model.cfg.n_layers - 1)
    protocol = MaskingConfig(layers=layers, ranking=scope, mode=mode)
    metrics = ["raw_attention", "value_weighted", "output_normalized", "contribution", "contribution_abs"]
    with torch.no_grad():
        _, c1 = model.run_with_cache(seq)
    got = metric_scores(model, seq, protocol, metrics)
    for m in metrics:
        for n, l in enumerate(layers):
            want = naive_metric(model, c1, l, "contribution" if m == "contribution_abs" else m, mode)
            if scope == "source":
                want = want.sum(0, keepdim=True)
            if m == "contribution_abs":
                want = want.abs()
            assert got[m][n, 0].shape == want.shape, m
            assert torch.allclose(got[m][n, 0].double(), want, atol=1e-5, rtol=1e-4), (m, l)


def test_intra_mode_query_scope_separates_output_normalised(tiny_gqa):
    from geolens.faithfulness import same_ranking_by_construction

    model, tokens, _ = tiny_gqa
    p = MaskingConfig(ranking="query", mode="intra", fractions=(0.3,))
    s = metric_scores(model, tokens[:1], p, ["value_weighted", "output_normalized"])
    a, b = (curve_masks(s[m], p) for m in ("value_weighted", "output_normalized"))
    assert not torch.equal(a, b)  # each head divided by its own output norm: rankings differ
    assert not same_ranking_by_construction(p)
    res = faithfulness_curves(model, tokens[:1], p, ["value_weighted", "output_normalized"], progress=False, n_boot=10)
    assert (res.per_sequence.same_as == "").all()  # run separately, no reuse
    for scope, mode in [("row", "intra"), ("row", "inter"), ("query", "inter"), ("source", "inter")]:
        q = MaskingConfig(ranking=scope, mode=mode, fractions=(0.1, 0.5, 0.9))
        assert same_ranking_by_construction(q)
        s = metric_scores(model, tokens[:1], q, ["value_weighted", "output_normalized"])
        a, b = (curve_masks(s[m], q) for m in ("value_weighted", "output_normalized"))
        assert (a != b).float().mean() < 1e-3, (scope, mode)  # equal up to float32 near-ties
