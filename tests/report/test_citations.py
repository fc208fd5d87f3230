"""Citations in the report (geolens.report.citations): each full citation once, claims cited by author
and year, no nickname left, both papers cited in full, the machine source kept in report.json."""

from __future__ import annotations

import re

from geolens.report.citations import DEYOUNG, PAPER_A, PAPER_B, REFERENCES, cite_text, references_of
from report.conftest import NICKNAME, parse_page


def test_each_full_citation_appears_once_and_claims_cite_by_author_and_year(tiny_report):
    import html

    from geolens.report.citations import REFERENCES, full_citation_html

    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    for ref in REFERENCES:
        assert page.count(full_citation_html(ref)) == 1, ref.key
        assert page.count(html.escape(ref.title)) == 1, ref.key  # nowhere else either (not in the claim table)
    table = page.split('<section id="claims">', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r"<tr><td>.*?</tr>", table, re.S)
    assert len(rows) == len(report.claims)
    for row in rows:
        source = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[1]
        links = re.findall(r'<a href="#ref-([a-z0-9]+)">([^<]+)</a>', source)
        assert links, source
        for key, text in links:
            assert f'<li id="ref-{key}">' in page and re.search(r"\b(19|20)\d\d\b", text), (key, text)


def test_no_nickname_remains_and_both_papers_are_cited_in_full(report_files):
    _, page, data = report_files
    body = page.split("</head>", 1)[1]
    assert not NICKNAME.search(body), NICKNAME.search(body).group(0)
    text = " ".join(parse_page(page).text)
    for ref in (PAPER_A, PAPER_B):
        assert ref.title in text and str(ref.year) in text
        assert all(name.strip() in text for name in ref.authors.split(","))
        assert ref.short in text  # author-year citations in the text
    assert 'id="references"' in page and page.count('<li id="ref-') == len(REFERENCES)
    # the claim table cites each claim's paper by author and year, linked to its one full citation
    rows = re.findall(r"<tr><td>.*?</tr>", page.split('<section id="claims">', 1)[1].split("</section>", 1)[0], re.S)
    assert rows
    flow_rows = [row for row in rows if 'href="#flow"' in row]
    assert flow_rows and len(flow_rows) < len(rows)
    for row in rows:
        if row in flow_rows:  # geolens' own pre-registered erasure test, after DeYoung et al. 2020
            assert f'<a href="#ref-{DEYOUNG.key}">{DEYOUNG.short}</a>' in row and "docs/flow/PROTOCOL.md" in row, row
        else:
            assert f'<a href="#ref-{PAPER_A.key}">' in row or f'<a href="#ref-{PAPER_B.key}">' in row, row[:300]
        assert not any(ref.title in row for ref in REFERENCES), row[:300]


def test_json_keeps_the_machine_source_and_carries_the_citation(report_files):
    _, _, data = report_files
    assert [r["key"] for r in data["references"]] == [r.key for r in REFERENCES]
    assert all({"authors", "title", "year", "full", "citation"} <= set(r) for r in data["references"])
    for c in data["claims"]:
        if c["section"] == "flow":  # geolens' own hypotheses, tested after DeYoung et al. 2020
            assert "docs/flow/PROTOCOL.md" in c["source"] and c["references"] == [DEYOUNG.full], c["source"]
        else:
            assert NICKNAME.search(c["source"])  # the machine key other code reads ("paper A §3.2")
        assert not NICKNAME.search(c["citation"]) and c["references"], c["source"]
        for field in ("claim", "measured", "criterion"):
            assert not NICKNAME.search(c[field]), (field, c[field])
    [sink] = [c for c in data["claims"] if c["source"] == "paper A §3.2" and c["section"] == "contributions"]
    assert sink["citation"] == "Cunningham & Muça Cirone 2026 §3.2" and sink["references"] == [PAPER_A.full]


def test_cite_text_replaces_every_nickname_form():
    assert cite_text("paper A §2.2–3.1") == "Cunningham & Muça Cirone 2026 §2.2–3.1"
    assert cite_text("papers A §3.2 and B") == "Cunningham & Muça Cirone 2026 §3.2 and Mudarisov et al. 2026"
    assert (
        cite_text("French summary of paper B (docs/method.md §5; unverified)")
        == "French summary of Mudarisov et al. 2026 (docs/method.md §5; unverified)"
    )
    assert cite_text("Paper A's claim") == "Cunningham & Muça Cirone 2026's claim"
    assert cite_text("none given by the paper") == "none given by the paper"
    assert [r.key for r in references_of("papers A §3.2 and B")] == [PAPER_A.key, PAPER_B.key]
    assert references_of("none") == []
    # the works the faithfulness and flow sections cite, by their author-year citation in the text
    text = "ALTI (Ferrando, Gállego & Costa-jussà 2022), routes (Ferrando & Voita 2024), ERASER (DeYoung et al. 2020), Holm 1979"
    assert [r.key for r in references_of(text)] == ["ferrando2022", "ferrando2024", "deyoung2020", "holm1979"]
