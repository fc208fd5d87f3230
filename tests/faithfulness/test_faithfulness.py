"""Faithfulness curves (docs/method.md §3): Value Zeroing, AUC, bootstrap and the curve driver."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from constructed import synthetic_result
from reference import naive_value_zeroing

from geolens.faithfulness import (
    ALL_METRICS,
    MaskingConfig,
    area_under_curve,
    auc_ci,
    claimed_order_holds,
    curve_masks,
    faithfulness_curves,
    metric_scores,
    value_zeroing,
)
from geolens.interventions import active_hook_count
from geolens.interventions.masking import masked_token_nll, token_nll


def test_value_zeroing_matches_naive_rerun(tiny):
    model, tokens, _ = tiny
    layers = list(range(model.cfg.n_layers))
    before = active_hook_count(model)
    got = value_zeroing(model, tokens, layers)
    chunked = value_zeroing(model, tokens, layers, chunk_size=5)
    assert got.shape == (len(layers), tokens.shape[0], tokens.shape[1], tokens.shape[1])
    assert active_hook_count(model) == before
    assert torch.allclose(got, chunked, atol=1e-6)
    for n, l in enumerate(layers):
        want = naive_value_zeroing(model, tokens, l)
        assert torch.allclose(got[n].double(), want, atol=2e-5), (l, (got[n].double() - want).abs().max())
    assert (got.triu(1) == 0).all()  # future sources never matter
    assert got.max() > 0


def test_value_zeroing_on_some_queries_equals_those_rows_of_the_full_scores(tiny):
    from geolens.testing import tiny_tokens

    model = tiny[0]
    tokens = tiny_tokens(model, length=14)[:1]
    full = value_zeroing(model, tokens, [0, 1])
    some = value_zeroing(model, tokens, [0, 1], queries={0: [3, 13], 1: [-1, 7]}, chunk_size=4)
    for n, rows in enumerate(([3, 13], [13, 7])):
        assert torch.allclose(some[n, :, rows], full[n, :, rows], atol=1e-6)
        others = [q for q in range(14) if q not in rows]
        assert bool((some[n, :, others] == 0).all())
    with pytest.raises(ValueError, match="layers"):
        value_zeroing(model, tokens, [0, 1], queries={0: [3]})


def test_value_zeroing_final_norm_scores_last_layer_after_ln_final(tiny):
    model, tokens, _ = tiny
    last = model.cfg.n_layers - 1
    # A HookedTransformer folds ln_final's gain into W_U (fold_ln): its ln_final only rescales,
    # which no cosine sees (a LayerNorm still centres). Elsewhere the gain is made non-uniform so that the norm matters.
    weights = [p for n, p in model.ln_final.named_parameters() if n.endswith("weight")]
    saved = [w.detach().clone() for w in weights]
    try:
        with torch.no_grad():  # a non-uniform gain, so that the norm changes the cosines
            for w in weights:
                w.mul_(torch.linspace(0.2, 3.0, w.numel()).reshape(w.shape))
        got = value_zeroing(model, tokens[:1, :10], [0, last], final_norm=True)
        plain = value_zeroing(model, tokens[:1, :10], [0, last])
        want = naive_value_zeroing(model, tokens[:1, :10], last, final_norm=True)
    finally:
        with torch.no_grad():
            for w, s in zip(weights, saved):
                w.copy_(s)
    assert torch.equal(got[0], plain[0])  # other layers unchanged
    assert torch.allclose(got[1].double(), want, atol=2e-5), (got[1].double() - want).abs().max()
    if weights:
        assert not torch.allclose(got[1], plain[1], atol=1e-4)  # the norm changes the scores


def test_value_zeroing_refuses_a_block_it_cannot_rebuild(tiny_gqa, monkeypatch):
    from geolens.adapter import adapter_for

    model, tokens, _ = tiny_gqa
    adapter = type(adapter_for(model))
    real = adapter.block_after_attention
    monkeypatch.setattr(adapter, "block_after_attention", lambda self, l, r, a: 2 * real(self, l, r, a))
    with pytest.raises(RuntimeError, match="not supported"):
        value_zeroing(model, tokens[:1, :8], [0])
    monkeypatch.undo()
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="chunk_size"):
            value_zeroing(model, tokens[:1, :8], [0], chunk_size=bad)


def test_area_under_curve_by_hand():
    fr = [0.1, 0.2, 0.4]
    y = [1.0, 3.0, 2.0]
    # trapezoids: 0.1·(1+3)/2 + 0.2·(3+2)/2 = 0.2 + 0.5
    assert area_under_curve(fr, y) == pytest.approx(0.7)
    assert np.allclose(area_under_curve(fr, [[1.0, 3.0, 2.0], [0, 0, 1]]), [0.7, 0.1])


def test_auc_ci_constant_rows_and_coverage():
    fr = [0.1, 0.5, 0.9]
    same = np.tile([1.0, 2.0, 4.0], (7, 1))
    value, lo, hi = auc_ci(fr, same, n_boot=200)
    assert value == pytest.approx(0.4 * 1.5 + 0.4 * 3.0) and lo == pytest.approx(value) and hi == pytest.approx(value)
    rng = np.random.default_rng(0)
    noisy = rng.normal(size=(50, 3)) + [1.0, 2.0, 4.0]
    value, lo, hi = auc_ci(fr, noisy, n_boot=500)
    assert lo < value < hi
    with pytest.raises(ValueError, match="n_sequences"):
        auc_ci(fr, noisy[:, :2])


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
def test_smollm2_value_zeroing_one_layer(smollm2, smollm2_tokens):
    seq = smollm2_tokens[:1, :16]
    got = value_zeroing(smollm2, seq, [12], chunk_size=8)[0]
    want = naive_value_zeroing(smollm2, seq, 12)
    assert torch.allclose(got.double(), want, atol=1e-4)


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


def test_paired_auc_difference_by_hand():
    import pandas as pd

    from geolens.faithfulness import FaithfulnessResult

    fr = (0.1, 0.5)
    rows = []
    for s, shift in enumerate([0.0, 1.0, 2.0]):  # large between-document spread, constant paired gap in NLL
        for d in ("comprehensiveness", "sufficiency"):
            for k in fr:
                rows.append(
                    dict(sequence=s, metric="raw_attention", direction=d, fraction=k, nll=shift + k, n_removed=0)
                )
                rows.append(
                    dict(sequence=s, metric="contribution", direction=d, fraction=k, nll=shift + k + 0.5, n_removed=0)
                )
    protocol = dict(
        fractions=fr, layers=[0], allow_sink=False, allow_current=False, mode="intra", ranking="row", skip_prefix=0
    )
    clean = pd.DataFrame(dict(sequence=[0, 1, 2], nll=[0.0, 1.0, 2.0], n_scored=10))
    res = FaithfulnessResult(protocol=protocol, per_sequence=pd.DataFrame(rows), clean=clean, n_boot=200)
    out = res.pairs([("raw_attention", "contribution")])
    row = out[(out.direction == "comprehensiveness") & (out.quantity == "delta_logprob")].iloc[0]
    assert row.auc_diff == pytest.approx(0.4 * 0.5)  # Δ log-prob lower by 0.5 everywhere: more faithful
    assert row.ci_low == pytest.approx(0.2) and row.ci_high == pytest.approx(0.2)
    suff = out[(out.direction == "sufficiency") & (out.quantity == "delta_logprob")].iloc[0]
    assert suff.auc_diff == pytest.approx(-0.2)
    assert row.verdict == "no range"  # no random ranking ran: no range check, no verdict


@pytest.mark.parametrize("kind", ["gqa", "gemma"])
def test_value_zeroing_runs_in_bfloat16(kind):
    """The rebuilt-block guard allows the model's own rounding: a bf16 model is scored, not refused,
    and its scores follow the float32 ones."""
    from conftest import HAS_BRIDGE, make_tiny

    if kind == "gemma" and not HAS_BRIDGE:
        pytest.skip("the tiny Gemma model needs TransformerBridge")
    model = make_tiny(kind)
    tokens = torch.randint(4, 40, (1, 10))
    tokens[:, 0] = 0
    want = value_zeroing(model, tokens, [0])
    model.to(torch.bfloat16)
    got = value_zeroing(model, tokens, [0])
    assert (got.triu(1) == 0).all()
    assert torch.allclose(got, want, atol=0.05), (got - want).abs().max()
    assert got.max() > 0


def test_pairs_that_cannot_differ_are_not_testable_and_testable_ones_keep_their_verdict():
    from geolens.faithfulness import claimed_order_holds, same_ranking_by_construction

    res = synthetic_result(
        dict(random=0.3, raw_attention=0.5, value_weighted=1.0, output_normalized=1.5, contribution=2.0)
    )
    for ranking, mode, identical in (("query", "inter", True), ("row", "intra", True), ("query", "intra", False)):
        res.protocol = dict(res.protocol, ranking=ranking, mode=mode)
        assert same_ranking_by_construction(res.protocol) is identical
        pairs = res.pairs()
        step = pairs[(pairs.a == "value_weighted") & (pairs.b == "output_normalized")]
        others = pairs[~((pairs.a == "value_weighted") & (pairs.b == "output_normalized"))]
        assert (step.verdict == "not testable").all() if identical else (step.verdict != "not testable").all()
        assert "not testable" not in set(others.verdict)
        order = claimed_order_holds(pairs)
        testable = [v for v in order["pairs"].values() if v != "not testable"]
        assert order["holds"] == all(v == "holds" for v in testable) and order["decided"]
