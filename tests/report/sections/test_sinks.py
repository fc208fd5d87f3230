"""The report's sinks section (geolens.report.sections.sinks): its claims follow its own numbers."""

from __future__ import annotations

import pytest

from report.conftest import section_json


def test_sink_claims_follow_the_sink_numbers(tiny_report):
    import numpy as np

    _, _, paths = tiny_report
    sec = section_json(paths, "sinks", "geolens.sinks")
    ratios = [r["value_norm_ratio"] for r in sec["numbers"]["geometry_heads"]["rows"]]
    [norm_claim] = [c for c in sec["claims"] if "3–10×" in c["claim"]]
    assert norm_claim["numbers"]["value_norm_ratio_median"] == pytest.approx(float(np.median(ratios)))
    assert norm_claim["criterion_met"] == (float(np.median(ratios)) <= 1 / 3)
    [drift_claim] = [c for c in sec["claims"] if "semantic cone" in c["claim"]]
    rows = {r["lambda"]: r for r in sec["numbers"]["drift_summary"]["rows"]}
    assert drift_claim["numbers"]["delta_ppl"] == pytest.approx(rows[0.0]["delta_ppl"])
    assert drift_claim["criterion_met"] == (
        rows[0.0]["delta_ppl"] > 0 and rows[0.0]["cos_cone_low_norm"] > rows[1.0]["cos_cone_low_norm"]
    )
