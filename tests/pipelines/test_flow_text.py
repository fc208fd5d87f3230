"""The README of a ``geolens flow --erasure`` folder (geolens.pipelines.flow_text.erasure_markdown),
from hand-built summaries: every number and verdict of the summary lands in its row, and a missing
part (second replacement, induction check) is left out rather than written as None or nan."""

from __future__ import annotations

import copy
import re

import pytest

from geolens.pipelines.flow_text import erasure_markdown


def _family(replacement: str, shift: float) -> dict:
    methods = [
        dict(direction=d, method=m, naopc=v + shift, ci_low=v + shift - 0.01, ci_high=v + shift + 0.01)
        for m, base in (("random", 0.1), ("alti", 0.3))
        for d, v in (("comprehensiveness", base), ("sufficiency", base / 2))
    ]
    pairs = [
        dict(direction="comprehensiveness", a="random", b="alti", delta=0.2, ci_low=0.15, ci_high=0.25, level=0.025)
        | dict(p_adj=0.0004, verdict="holds"),
        dict(direction="sufficiency", a="random", b="alti", delta=-0.1, ci_low=-0.2, ci_high=0.05, level=0.05)
        | dict(p_adj=0.31, verdict="tie"),
    ]
    return dict(replacement=replacement, n_predictions=30, n_documents=10, methods=methods, pairs=pairs)


SUMMARY = dict(
    seconds=12.5,
    erasure_seconds=340.0,
    protocol_path="docs/flow/protocol.json",
    protocol_version=1,
    protocol_sha256="abcdef0123456789" * 4,
    status="pre-registered",
    n_documents=10,
    n_predictions=30,
    range_check={"space": dict(n_predictions=30, excluded_kl=2), "unigram": dict(n_predictions=30, excluded_kl=0)},
    families=dict(primary=_family("space", 0.0), robustness=_family("unigram", 0.05)),
    most_faithful=dict(
        comprehensiveness=dict(method="alti", by=0.2, ci_low=0.15, ci_high=0.25, against="random"), sufficiency=None
    ),
    verdict_changes=[dict(direction="sufficiency", a="random", b="alti", primary="tie", robustness="reversed")],
    ig_completeness=dict(n_steps=32, median_abs_gap=0.0123, median_rel_gap=0.0456, share_rel_gap_within_5pct=0.75),
    induction_check={
        "alti": dict(n=19, passed=7, passed_no_bos=9, median_rank_target=2.0, median_gap_when_failing=0.5),
    },
)


def _markdown(summary: dict) -> str:
    return erasure_markdown(summary, title="tiny-gqa", command="geolens flow --erasure --model tiny-gqa")


def _row(text: str, start: str) -> str:
    [row] = [line for line in text.splitlines() if line.startswith(start)]
    return row


def test_every_number_of_the_summary_lands_in_its_row():
    text = _markdown(SUMMARY)
    assert text.startswith("# Input-token erasure: tiny-gqa\n")
    assert (
        "`geolens flow --erasure --model tiny-gqa` (12.5 s in this invocation; the per-document stage 340.0 s)" in text
    )
    assert "(version 1, sha256 `abcdef012345…`), pre-registered." in text
    assert "space: 2 of 30 predictions excluded (KL); unigram: 0 of 30 predictions excluded (KL)" in text
    assert "one Holm family of 2 tests per replacement" in text
    # the nAOPC table: one row per method, primary then robustness, comprehensiveness then sufficiency
    assert (
        "| comprehensiveness (space) | sufficiency (space) | comprehensiveness (unigram) | sufficiency (unigram) |"
        in text
    )
    assert _row(text, "| ALTI | 0.") == (
        "| ALTI | 0.300 [0.290, 0.310] | 0.150 [0.140, 0.160] | 0.350 [0.340, 0.360] | 0.200 [0.190, 0.210] |"
    )
    assert _row(text, "| random | 0.").startswith("| random | 0.100 [0.090, 0.110] | 0.050 [0.040, 0.060] |")
    # the primary family's pairs, each with its Holm level, p_adj and verdict
    assert _row(text, "| comprehensiveness | random → ALTI") == (
        "| comprehensiveness | random → ALTI | +0.2000 [+0.1500, +0.2500] | 0.0250 | 0.0004 | holds |"
    )
    sufficiency = _row(text, "| sufficiency | random → ALTI")
    assert sufficiency.endswith("| -0.1000 [-0.2000, +0.0500] | 0.0500 | 0.31 | tie |")
    assert "- comprehensiveness: **ALTI**, by at least +0.2000 [+0.1500, +0.2500] over random" in text
    assert "- sufficiency: no method beats every other" in text
    assert "Verdicts that differ under the unigram replacement: sufficiency random → ALTI: tie vs reversed." in text
    assert (
        "Integrated gradients (32 steps): median |completeness gap| 0.0123 (median relative 0.0456; within 5% for 75%"
        in text
    )
    assert _row(text, "| ALTI | 7/19") == "| ALTI | 7/19 | 9/19 | 2 | 0.5 |"
    assert not re.search(r"\bNone\b|\bnan\b", text)


def test_a_run_without_a_second_replacement_or_induction_check_leaves_them_out():
    s = copy.deepcopy(SUMMARY)
    del s["families"]["robustness"]
    s.update(verdict_changes=[], induction_check={"skipped": "no repeated tokens"}, ig_completeness=None)
    s.update(status="exploratory", differences=["a tiny model", "10 documents"])
    text = _markdown(s)
    assert "**Exploratory run, no verdicts**: a tiny model; 10 documents." in text
    assert "| method | comprehensiveness (space) | sufficiency (space) |\n|---|---|---|\n" in text
    assert _row(text, "| ALTI |") == "| ALTI | 0.300 [0.290, 0.310] | 0.150 [0.140, 0.160] |"
    assert "Verdicts that differ under the second replacement: none." in text
    assert "Known-answer check skipped: no repeated tokens" in text
    assert "Integrated gradients" not in text and "unigram)" not in text
    assert not re.search(r"\bNone\b|\bnan\b", text)


@pytest.mark.parametrize(
    "fields, start, expected",
    [
        (  # docs/flow/v2: the even grid's steps
            dict(max_steps=288, steps_used={"32": 20, "96": 10}, rule="|gap| ≤ 1% of |f(x) − f(x')|"),
            "Integrated gradients, adaptive steps",
            "Integrated gradients, adaptive steps (32 tripled up to 288; steps used: 32 × 20, 96 × 10): within 1% of "
            "completeness (|gap| ≤ 1% of |f(x) − f(x')|) for 90.0% of predictions; median |completeness gap| 0.0123.",
        ),
        (  # docs/flow/v3: the local grid's gradients and forward passes
            dict(
                max_steps=864,
                grid="local",
                median_steps=90.0,
                max_steps_used=488,
                steps_quantiles={"p10": 32.0, "p90": 154.0},
                total_gradients=30000,
                total_forward=27000,
                rule="|gap| ≤ 1%",
            ),
            "Integrated gradients on the local grid",
            "Integrated gradients on the local grid (32 even steps, then intervals split where the local completeness "
            "error is largest, up to 864 gradients; gradients used: median 90, 10-90% 32-154, at most 488; 30000 "
            "gradients and 27000 forward passes in all): within 1% of completeness (|gap| ≤ 1%) for 90.0% of "
            "predictions; median |completeness gap| 0.0123.",
        ),
    ],
    ids=["even", "local"],
)
def test_adaptive_integrated_gradients_report_their_steps_and_the_one_percent_share(fields, start, expected):
    s = copy.deepcopy(SUMMARY)
    s["ig_completeness"] |= dict(fields, share_rel_gap_within_1pct=0.9)
    assert _row(_markdown(s), start) == expected


def test_a_method_missing_from_one_direction_shows_a_dash():
    s = copy.deepcopy(SUMMARY)
    fam = s["families"]["primary"]
    fam["methods"] = [m for m in fam["methods"] if not (m["method"] == "alti" and m["direction"] == "sufficiency")]
    assert _row(_markdown(s), "| ALTI | 0.").startswith("| ALTI | 0.300 [0.290, 0.310] | – |")
