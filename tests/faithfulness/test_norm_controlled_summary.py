"""The summary of protocol 3's per-term endpoint (geolens.faithfulness.norm_controlled_summary): every
field, the pairs with adjusted p-values and verdicts, the not-testable pair, float64 effects and
their numerical floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geolens.faithfulness.norm_controlled import (
    norm_controlled_summary,
)

pytestmark = pytest.mark.bridge_only  # float64_exact is about the TL 4.x bridge's softmax; built on tiny bridges


V3 = Path(__file__).parents[2] / "docs" / "faithfulness" / "v3"


def test_summary_fields(norm_controlled_run):
    _, _, terms, positions = norm_controlled_run
    settings = json.loads((V3 / "protocol.json").read_text())
    settings["statistics"]["n_boot"] = 200
    part = norm_controlled_summary(terms, positions, settings)
    assert part["effects_dtype"] == "float64"
    nc = part["norm_controlled"]
    assert len(nc["pairs"]) == 9 and all("p_adj" in p and "verdict" in p for p in nc["pairs"])
    assert {m["metric"]: m["mean"] for m in nc["metrics"]}["value_weighted"] == 0.0
    assert nc["not_testable"][0]["verdict"] == "not testable"
    for key in ("per_layer", "resolvable", "signed", "plain", "strata", "top_decile", "numerical_floor"):
        assert key in part, key
    assert part["numerical_floor"]["kl_floor_max"] < 1e-12
