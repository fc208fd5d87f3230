"""Faithfulness results (geolens.faithfulness.result): the AUC and its bootstrap interval by hand, the
paired AUC difference, the verdicts from the paired intervals on constructed results (no range
decides nothing, pairs that cannot differ are not testable), and the save/load round trip."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from constructed import synthetic_result

from geolens.faithfulness import (
    CLAIMED_ORDER,
    FaithfulnessResult,
    area_under_curve,
    auc_ci,
    claimed_order_holds,
)


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


def test_verdicts_follow_the_paired_ci():
    gaps = dict(random=0.3, raw_attention=1.0, value_weighted=1.0, output_normalized=0.5, contribution=2.0)
    res = synthetic_result(gaps)
    res.protocol = dict(res.protocol, mode="intra")  # where output-normalised can differ from value-weighted
    pairs = res.pairs()
    assert len(pairs) and (pairs.n_boot == 1000).all()
    for r in pairs.itertuples():  # never a verdict contradicting its CI
        assert r.ci_low <= r.auc_diff <= r.ci_high
        assert r.verdict == ("holds" if r.ci_low > 0 else "reversed" if r.ci_high < 0 else "tie")
    comp = claimed_order_holds(pairs, "comprehensiveness", "delta_ppl")
    assert comp["pairs"] == {
        "raw_attention < value_weighted": "tie",
        "value_weighted < output_normalized": "reversed",
        "output_normalized < contribution": "holds",
    }
    assert not comp["holds"]
    # sufficiency here moves all metrics' NLL by (1 − gap)·k: a larger gap is again more faithful
    suff = claimed_order_holds(pairs, "sufficiency", "delta_ppl")
    assert suff["pairs"]["output_normalized < contribution"] == "holds"
    # Δ log-prob agrees in sign with ΔPPL after the faithfulness sign
    lp = claimed_order_holds(pairs, "comprehensiveness", "delta_logprob")
    assert lp["pairs"] == comp["pairs"]
    row = pairs[
        (pairs.a == "output_normalized")
        & (pairs.b == "contribution")
        & (pairs.direction == "comprehensiveness")
        & (pairs.quantity == "delta_logprob")
    ]
    assert row.auc_diff.item() == pytest.approx(
        1.5 * (0.4 * 0.6 / 2 + 0.4 * 1.4 / 2), rel=0.05
    )  # ∫ 1.5·k dk over [0.1, 0.9]
    full = claimed_order_holds(
        synthetic_result(
            dict(random=0.1, raw_attention=0.5, value_weighted=1.0, output_normalized=1.5, contribution=2.0)
        ).pairs()
    )
    assert full["holds"] and set(full["pairs"]) == {f"{a} < {b}" for a, b in zip(CLAIMED_ORDER, CLAIMED_ORDER[1:])}


def test_no_range_decides_nothing():
    res = synthetic_result(dict(random=0.0001, raw_attention=0.5, contribution=2.0))
    rc = res.range_check()
    assert rc["random_delta_ppl_rel_at_max_fraction"] < 0.01 and not rc["has_range"]
    assert rc["sink_only_delta_ppl"] == pytest.approx(
        math.exp(res.clean.nll.mean() + 0.5) - math.exp(res.clean.nll.mean())
    )
    assert set(res.pairs().verdict) == {"no range"}
    assert "NO RANGE" in str(res)
    assert synthetic_result(dict(random=0.1, raw_attention=0.5)).range_check()["has_range"]


def test_save_load_round_trip(tmp_path):
    res = synthetic_result(dict(random=0.3, raw_attention=1.0, contribution=2.0))
    res.meta = dict(model="toy", seq_len=128, n_sequences=40)
    res.save(tmp_path)
    back = FaithfulnessResult.load(tmp_path)
    pd.testing.assert_frame_equal(back.pairs(), res.pairs())
    saved, original = back.summary()["range_check"], res.summary()["range_check"]
    assert saved.keys() == original.keys()
    for key, value in original.items():  # floats survive the CSV round trip to the last bit or two
        assert saved[key] == (
            pytest.approx(value, rel=1e-12) if not isinstance(value, (str, bool)) and value is not None else value
        ), key
