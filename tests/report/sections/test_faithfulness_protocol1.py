"""Protocol 1's superseded faithfulness curves in the report
(geolens.report.sections.faithfulness_protocol1): only in a labelled appendix of a full report,
its claim following its table."""

from __future__ import annotations

import json


def test_full_report_keeps_protocol_1_only_in_a_labelled_appendix(full_faithfulness):
    report, paths = full_faithfulness
    assert [s.key for s in report.sections] == ["faithfulness", "faithfulness_protocol1"]
    current, appendix = report.sections
    assert appendix.appendix and not current.appendix and appendix.title.startswith("Appendix:")
    assert "superseded" in appendix.title and appendix.intro.startswith("<b>Superseded.</b>")
    assert "curves" not in current.numbers and not current.figures
    assert all("superseded" in c.claim for c in appendix.claims) and appendix.claims
    assert not any("superseded" in c.claim for c in current.claims)
    data = json.loads(paths["json"].read_text())
    assert data["sections"]["faithfulness_protocol1"]["appendix"] is True
    assert not any(f["section"] == "faithfulness_protocol1" for f in data["first_screen"]["findings"])
    page = paths["html"].read_text(encoding="utf-8")
    assert (
        page.index('<section id="faithfulness">')
        < page.index('<section id="faithfulness_protocol1" class="appendix">')
        < page.index('<section id="run">')
    )


def test_the_protocol_1_claim_follows_its_table(tiny_report, full_faithfulness):
    _, report, _ = tiny_report
    sections = {s.key: s for s in report.sections + full_faithfulness[0].sections[1:]}
    if "faithfulness_protocol1" in sections:
        pairs = sections["faithfulness_protocol1"].numbers["pairs"]
        comp = pairs[(pairs.direction == "comprehensiveness") & (pairs.quantity == "delta_logprob") & pairs.claimed]
        [claim] = [c for c in sections["faithfulness_protocol1"].claims if "(comprehensiveness)" in c.claim]
        verdicts = set(comp.verdict)
        if verdicts <= {"holds", "tie", "reversed"}:
            assert claim.holds == (verdicts == {"holds"})
        else:  # one quick-mode document, or no range: undecided, never a verdict without a CI
            assert claim.holds is None
