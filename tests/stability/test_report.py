"""The stability table (geolens.stability.report): counts, flips and labels as the results give them."""

from __future__ import annotations

from geolens.stability.report import render


def _result(label, layers=True):
    test = dict(
        test="comprehensiveness: raw_attention → contribution",
        verdict="holds",
        documents=dict(
            n=100,
            kept=96 if label == "stable" else 34,
            share=0.96,
            flips={"tie": 4} if label == "stable" else {"tie": 66},
        ),
        layers=dict(n=30, kept=30, share=1.0, flips={}) if layers else None,
        label=label,
    )
    return dict(
        family="f",
        model="m",
        unit="document",
        n_units=100,
        n_layers=30 if layers else None,
        layers_not_applicable=None if layers else "no layer",
        reproduces=True,
        mismatches=[],
        n_fragile=int(label == "fragile"),
        n_tests=1,
        tests=[test, dict(test="x → y", verdict="not testable", label=None)],
    )


def test_the_table_prints_kept_shares_flips_and_labels():
    combined, text = render([_result("stable"), _result("fragile", layers=False)])
    assert combined["n_tests"] == 2 and combined["n_fragile"] == 1 and combined["all_reproduce"]
    assert "| comprehensiveness: raw_attention → contribution | holds | 96/100 (→ tie 4) | 30/30 | stable |" in text
    assert "| holds | 34/100 (→ tie 66) | n/a | **fragile** |" in text
    assert "layers: not applicable (no layer)" in text and "| x → y | not testable | – | – | – |" in text
    assert "1 of 2 verdicts in 2 families are fragile" in text


def test_the_results_page_paragraphs_are_refilled_between_their_markers():
    from geolens.stability.report import fill_markers

    combined, _ = render([_result("fragile")])
    text = "before\n<!-- stability: f -->\nold text\n<!-- /stability -->\nafter\n<!-- stability: other -->\n<!-- /stability -->\n"
    out = fill_markers(text, combined)
    assert out.startswith("before\n<!-- stability: f -->\n**Stability**") and "old text" not in out
    assert (
        "on m, 1 of 1 verdicts are fragile: comprehensiveness: raw_attention → contribution (holds; kept in 34/100"
        in out
    )
    assert "else tie" in out and out.endswith("<!-- stability: other -->\n<!-- /stability -->\n")
    assert fill_markers(out, combined) == out  # refilling is idempotent
