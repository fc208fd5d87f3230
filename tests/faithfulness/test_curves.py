"""The faithfulness curve driver (geolens.faithfulness.curves, docs/method.md §3): end to end on a tiny
model (one row recomputed with masked_token_nll), all layers at once against one forward per mask,
the protocol's bad input, and comprehensiveness
against random on SmolLM2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from geolens.faithfulness import (
    ALL_METRICS,
    MaskingConfig,
    claimed_order_holds,
    curve_masks,
    faithfulness_curves,
    metric_scores,
)
from geolens.interventions import applied
from geolens.interventions.masking import (
    masked_token_nll,
    pattern_mask_hooks,
    token_nll,
)


def test_faithfulness_curves_end_to_end(tiny_gqa):
    model, tokens, _ = tiny_gqa
    protocol = MaskingConfig(layers=(1,), ranking="row", fractions=(0.3, 0.6, 0.9), skip_prefix=2)
    res = faithfulness_curves(model, tokens, protocol, ALL_METRICS, progress=False, n_boot=50)
    df = res.per_sequence
    assert len(df) == tokens.shape[0] * len(ALL_METRICS) * 2 * 3
    # recompute one row by hand: contribution, comprehensiveness, k = 0.6, sequence 1
    seq = tokens[1:2]
    scores = metric_scores(model, seq, protocol, ["contribution"])["contribution"]
    masks = curve_masks(scores, protocol)
    nll = masked_token_nll(model, seq, masks[:, 1:2], [1], branch=False)[0, 2:]
    with torch.no_grad():
        clean = token_nll(model(seq, return_type="logits"), seq)[0, 2:]
    row = df[
        (df.sequence == 1)
        & (df.metric == "contribution")
        & (df.direction == "comprehensiveness")
        & (df.fraction == 0.6)
    ]
    assert row.nll.item() == pytest.approx(float(nll.mean()), rel=1e-5)
    assert res.clean.set_index("sequence").nll[1] == pytest.approx(float(clean.mean()), rel=1e-5)
    auc = res.auc()
    assert set(auc.metric) == set(ALL_METRICS)
    assert (auc.ci_low <= auc.auc + 1e-12).all() and (auc.auc <= auc.ci_high + 1e-12).all()
    text = str(res)
    assert (
        "layers masked together = one layer (1)" in text
        and "sink (pos 0) removable = True" in text
        and "ranking = row" in text
    )
    order = claimed_order_holds(res.pairs())
    assert set(order["pairs"].values()) <= {"holds", "tie", "reversed", "no range", "too few documents", "not testable"}
    # per-row rankings: value-weighted and output-normalised remove the same sources, so that step
    # is "not testable" (never a "tie"), and it neither supports nor blocks the claimed order
    assert order["pairs"]["value_weighted < output_normalized"] == "not testable"
    vw = df[df.metric == "value_weighted"].nll.to_numpy()
    assert np.array_equal(vw, df[df.metric == "output_normalized"].nll.to_numpy())
    assert set(order["pairs"]) == {
        "raw_attention < value_weighted",
        "value_weighted < output_normalized",
        "output_normalized < contribution",
    }


def test_protocol_errors(tiny_gqa):
    model, tokens, _ = tiny_gqa
    with pytest.raises(ValueError, match="unknown metrics"):
        metric_scores(model, tokens[:1], MaskingConfig(), ["attention"])
    with pytest.raises(ValueError, match="tokens"):
        faithfulness_curves(model, tokens[0], MaskingConfig(), progress=False)


@pytest.mark.slow
def test_smollm2_comprehensiveness_hurts_more_than_random(smollm2, smollm2_tokens):
    protocol = MaskingConfig(
        layers=tuple(range(24, 30)), ranking="row", allow_sink=False, allow_current=False, fractions=(0.5,)
    )
    res = faithfulness_curves(
        smollm2, smollm2_tokens[:2, :48], protocol, ["contribution", "random"], progress=False, n_boot=50
    )
    df = res.per_sequence.groupby(["metric", "direction"]).nll.mean()
    assert df["contribution", "comprehensiveness"] > df["random", "comprehensiveness"]
    assert df["contribution", "sufficiency"] < df["contribution", "comprehensiveness"]


def test_all_layer_curves_match_one_forward_per_mask(tiny_gqa):
    """Batched all-layer masked forwards (chunks of 5 masks) equal one hand-hooked forward per mask."""
    model, tokens, _ = tiny_gqa
    protocol = MaskingConfig(ranking="query", fractions=(0.1, 0.5, 0.9), skip_prefix=3)
    metrics = ["contribution", "value_weighted", "output_normalized", "random"]
    res = faithfulness_curves(model, tokens[:2], protocol, metrics, chunk_size=5, progress=False, n_boot=50)
    layers = list(range(model.cfg.n_layers))
    seq = tokens[1:2]
    scores = metric_scores(model, seq, protocol, ["contribution"])["contribution"]
    masks = curve_masks(scores, protocol)
    with torch.no_grad():
        clean = token_nll(model(seq, return_type="logits"), seq)[0, 3:]
        with applied(model, pattern_mask_hooks(model, masks[:, 4:5], layers)):  # sufficiency, k = 0.5
            masked = token_nll(model(seq, return_type="logits"), seq)[0, 3:]
    df = res.per_sequence
    row = df[
        (df.sequence == 1) & (df.metric == "contribution") & (df.direction == "sufficiency") & (df.fraction == 0.5)
    ]
    assert row.nll.item() == pytest.approx(float(masked.double().mean()), abs=1e-5)
    cl = res.clean.set_index("sequence").loc[1]
    assert cl.nll == pytest.approx(float(clean.double().mean()), abs=1e-5) and cl.n_scored == tokens.shape[1] - 4
    # the sink alone: α_i0 = 0 for i ≥ 1 in every head and layer
    sink = torch.zeros(len(layers), 1, model.cfg.n_heads, 12, 12, dtype=torch.bool)
    sink[..., 1:, 0] = True
    assert cl.sink_nll == pytest.approx(
        float(masked_token_nll(model, seq, sink, layers, branch=False)[0, 3:].double().mean()), abs=1e-5
    )
    # inter mode: output-normalised ranks like value-weighted (‖o_i‖ constant per query) and is reused
    vw = df[df.metric == "value_weighted"].nll.to_numpy()
    assert np.array_equal(vw, df[df.metric == "output_normalized"].nll.to_numpy())
    assert (df[df.metric == "output_normalized"].same_as == "value_weighted").all()
    # corpus-level ΔPPL = exp(token-weighted mean NLL) − exp(clean), by hand
    curves = res.curves
    sub = df[(df.metric == "random") & (df.direction == "comprehensiveness") & (df.fraction == 0.9)].sort_values(
        "sequence"
    )
    want = math.exp(sub.nll.mean()) - math.exp(res.clean.nll.mean())  # equal n_scored per document
    got = curves[
        (curves.metric == "random") & (curves.direction == "comprehensiveness") & (curves.fraction == 0.9)
    ].delta_ppl.item()
    assert got == pytest.approx(want, rel=1e-9)
    assert res.range_check()["random_delta_ppl_at_max_fraction"] == pytest.approx(want, rel=1e-9)
    summary = res.summary()
    assert summary["protocol"]["ranking_scope"] == "query" and summary["protocol"]["layers"] == layers
    assert {"a", "b", "direction", "quantity", "auc_diff", "ci_low", "ci_high", "verdict"} <= set(summary["pairs"][0])
