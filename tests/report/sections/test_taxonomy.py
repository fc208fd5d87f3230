"""The report's taxonomy section (geolens.report.sections.taxonomy): the offset statistic of 'other'
winners is shown."""

from __future__ import annotations

from report.conftest import section_json


def test_taxonomy_section_shows_the_offset_statistic(tiny_report):
    _, report, paths = tiny_report
    sec = section_json(paths, "taxonomy", "geolens.taxonomy")
    rows = sec["numbers"]["heads"]["rows"]
    assert {"top_offset", "top_offset_share", "label", "offset_dominant"} <= set(rows[0])
    dominated = [r["label"] for r in rows if r["offset_dominant"]]
    assert sec["numbers"]["offset_dominated"]["labels"] == dominated
    assert all(lab.startswith("Reset (offset −") for lab in dominated)
    assert sec["params"]["queries"] == "all"
    page = paths["html"].read_text(encoding="utf-8")
    assert "offset-dominated heads" in page and "window prefixes" in page
