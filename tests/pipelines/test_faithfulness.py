"""The claims of the faithfulness pipeline (geolens.pipelines.faithfulness): the masking claims read a
verdict only on the protocol's minimum sample, the per-term claims are decided by the pre-registered
pairs, and those pairs are the protocol's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from geolens.claims import PROTOCOL_MIN_DOCUMENTS, sample_size

ROOT = Path(__file__).resolve().parents[2]


VERDICT_WORDS = re.compile(r"\bholds\b|does not hold|\breversed\b|\btie\b", re.IGNORECASE)


def _pairs(verdicts: dict[str, str]) -> pd.DataFrame:
    """A faithfulness pairs table: the three claimed steps, both directions, with the given verdicts
    for comprehensiveness (sufficiency: all holds, or all "no range" after a failed range check)."""
    from geolens.faithfulness import CLAIMED_STEPS
    from geolens.pipelines.faithfulness import QUANTITY

    rows = []
    for direction in ("comprehensiveness", "sufficiency"):
        for i, (a, b) in enumerate(CLAIMED_STEPS):
            no_range = "no range" in verdicts.values()  # a failed range check leaves every pair undecided
            v = verdicts[f"{a} < {b}"] if direction == "comprehensiveness" else ("no range" if no_range else "holds")
            lo, hi = {
                "holds": (0.1, 0.3),
                "tie": (-0.1, 0.2),
                "reversed": (-0.3, -0.1),
                "no range": (0.1, 0.3),
                "not testable": (0.0, 0.0),
            }[v]
            rows.append(
                dict(
                    a=a,
                    b=b,
                    direction=direction,
                    quantity=QUANTITY,
                    auc_diff=(lo + hi) / 2 + i,
                    ci_low=lo,
                    ci_high=hi,
                    verdict=v,
                    claimed=True,
                )
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "step_verdicts, holds",
    [
        (("holds", "not testable", "holds"), True),
        (("holds", "tie", "holds"), False),
        (("no range", "no range", "no range"), None),
    ],
)
def test_faithfulness_claims_read_a_verdict_only_on_the_protocols_minimum(step_verdicts, holds):
    from geolens.faithfulness import CLAIMED_STEPS
    from geolens.pipelines.faithfulness import faithfulness_claims

    steps = {f"{a} < {b}": v for (a, b), v in zip(CLAIMED_STEPS, step_verdicts)}
    range_check = {
        "has_range": "no range" not in step_verdicts,
        "max_fraction": 0.2,
        "random_delta_ppl_rel_at_max_fraction": 0.05,
    }
    order, suff, alignment = faithfulness_claims(_pairs(steps), range_check)
    assert order.ci and suff.ci and not alignment.ci  # "the largest gain" compares point estimates
    assert order.holds is holds and suff.holds is (True if holds is not None else None)
    for claim in (order, suff):
        assert not VERDICT_WORDS.search(claim.measured), claim.measured  # the numbers and CIs, no step verdicts
        for n, want in (
            (PROTOCOL_MIN_DOCUMENTS - 1, "indicative"),
            (PROTOCOL_MIN_DOCUMENTS, {True: "holds", False: "does not hold", None: "undecided"}[claim.holds]),
        ):
            claim.numbers["sample"] = sample_size(n, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS)
            assert claim.verdict == f"{want} (n = {n} documents)"
    assert "[+0.1, +0.3]" in order.measured and ("identical masks by construction" in order.measured) == (
        "not testable" in step_verdicts
    )
    alignment.numbers["sample"] = sample_size(500, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS)
    assert alignment.decision == ("descriptive" if holds is None else "indicative")


def _per_term_summary(verdicts: dict, n_documents: int) -> dict:
    """A per-term summary (geolens.faithfulness.ground_truth.ground_truth_summary's layout) with the
    given verdicts of the term-scope pairs."""
    from geolens.pipelines.faithfulness import PER_TERM_PAIRS

    bounds = {"holds": (0.05, 0.2), "tie": (-0.05, 0.1), "reversed": (-0.2, -0.05), "not testable": (None, None)}
    pairs = []
    for scope in ("term", "source"):
        for a, b in PER_TERM_PAIRS:
            if scope == "term" and "value_zeroing" in (a, b):
                continue  # Value Zeroing has source scope only
            v = verdicts.get((a, b), "holds") if scope == "term" else "tie"
            lo, hi = bounds[v]
            pairs.append(
                dict(
                    endpoint="per_term",
                    scope=scope,
                    outcome="kl",
                    a=a,
                    b=b,
                    estimate=0.0 if lo is None else (lo + hi) / 2,
                    ci_low=lo,
                    ci_high=hi,
                    verdict=v,
                )
            )
    metrics = [
        dict(
            scope="term",
            outcome="kl",
            metric=m,
            spearman=s,
            ci_low=s - 0.1,
            ci_high=s + 0.1,
            n_positions=20 * n_documents,
            n_documents=n_documents,
        )
        for m, s in (("raw_attention", 0.1), ("contribution", 0.4), ("contribution_abs", 0.5))
    ]
    return {"pairs": pairs, "metrics": metrics}


@pytest.mark.parametrize(
    "verdicts, order, gap",
    [
        ({}, True, True),
        ({("value_weighted", "output_normalized_intra"): "tie"}, False, True),
        (
            {("output_normalized_inter", "contribution"): "reversed", ("raw_attention", "contribution"): "reversed"},
            False,
            False,
        ),
        ({("raw_attention", "value_weighted"): "not testable"}, True, True),  # left out, as in protocol 1's claims
        (
            {
                ("raw_attention", "value_weighted"): "not testable",
                ("value_weighted", "output_normalized_intra"): "not testable",
                ("output_normalized_inter", "contribution"): "not testable",
            },
            None,
            True,
        ),
    ],
)
def test_per_term_claims_are_decided_by_the_pre_registered_pairs(verdicts, order, gap):
    from geolens.pipelines.faithfulness import per_term_claims

    for n, decided in ((PROTOCOL_MIN_DOCUMENTS, True), (7, False)):
        claims = per_term_claims(_per_term_summary(verdicts, n), windows="documents")
        steps, versus, best = claims
        assert steps.ci and versus.ci and not best.ci and best.holds is None
        assert (steps.holds, versus.holds) == (order, gap)
        for c in (steps, versus):
            want = {True: "holds", False: "does not hold", None: "undecided"}[c.holds] if decided else "indicative"
            assert c.verdict == f"{want} (n = {n} documents)"
        assert best.decision == "descriptive" and best.numbers["best"] == "contribution_abs"
        assert f"{20 * n} (layer, query) positions" in steps.measured
        assert not VERDICT_WORDS.search(
            steps.measured + versus.measured
        )  # intervals, no pair verdicts: the claim's own verdict rules


def test_per_term_pairs_are_the_protocols():
    from geolens.pipelines.faithfulness import CLAIMED_PER_TERM_STEPS, PER_TERM_PAIRS, PerTermParams

    protocol = json.loads((ROOT / "docs" / "faithfulness" / "protocol.json").read_text(encoding="utf-8"))
    assert [list(p) for p in PER_TERM_PAIRS] == protocol["pairs"]
    assert CLAIMED_PER_TERM_STEPS == (
        ("raw_attention", "value_weighted"),
        ("value_weighted", "output_normalized_intra"),
        ("output_normalized_inter", "contribution"),
    )
    params = PerTermParams.from_protocol(protocol)
    assert params == PerTermParams(
        queries=(8, 126)
    )  # the defaults are the protocol's, but for the query range of its 128-token windows
    assert params.query_range(128) == PerTermParams().query_range(128) == tuple(protocol["data"]["scored_positions"])
    assert (
        params.n_positions == protocol["primary"]["positions_per_document"]
        and params.n_boot == protocol["statistics"]["n_boot"]
    )
    with pytest.raises(ValueError, match="n_positions"):
        PerTermParams(n_positions=0)
    with pytest.raises(ValueError, match="no query"):
        PerTermParams().query_range(2)
