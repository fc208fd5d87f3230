"""The report's contributions section (geolens.report.sections.contributions): the heatmap's caption
matches its colour scale."""

from __future__ import annotations

import pytest


def test_contribution_heatmap_caption_matches_its_colour_scale(report_files):
    report, _, _ = report_files
    section = next(s for s in report.sections if s.key == "contributions")
    heat = next(
        f for f in section.figures if getattr(f, "components", None) and f.components[0].name == "AttentionHeads"
    )
    contrib = heat.components[1]
    scale = heat.data["contribution_scale"]
    assert contrib.props["minValue"] == scale["min"] and contrib.props["maxValue"] == scale["max"]
    values = heat.data["contribution"][:, 1:]
    if (values < 0).any():  # the most negative weight is full red, whatever its size next to the positives
        assert scale["min"] == pytest.approx(values.min().item()) and "full red" in contrib.caption
    assert "symmetric" not in section.intro
