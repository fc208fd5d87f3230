"""The pre-registered faithfulness protocol (docs/faithfulness/PROTOCOL.md and protocol.json).

The text is frozen: its SHA-256 is recorded in PROTOCOL.sha256, and runs under it record the same
hash. Editing the text makes a new protocol version, deliberately (bump ``version`` in
protocol.json and the hash together). The machine-readable twin must say what the text says.
The protocol's rules in code (geolens.faithfulness.protocol): layer groups, the sign of each
direction and the verdict of an interval.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from constructed import synthetic_result

from geolens.faithfulness import (
    claimed_order_holds,
    faithfulness_sign,
    layer_group,
    verdict,
)

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "faithfulness"


def _protocol():
    return json.loads((FOLDER / "protocol.json").read_text(encoding="utf-8"))


def test_the_text_is_frozen_by_its_recorded_hash():
    digest = hashlib.sha256((FOLDER / "PROTOCOL.md").read_bytes()).hexdigest()
    assert digest == (FOLDER / "PROTOCOL.sha256").read_text().strip(), (
        "PROTOCOL.md changed after it was fixed: a new protocol version needs a new version number "
        "in protocol.json and a new PROTOCOL.sha256"
    )
    assert f"version {_protocol()['version']}" in (FOLDER / "PROTOCOL.md").read_text(encoding="utf-8")


def test_primary_protocol_is_per_layer_bounded_and_corrected():
    p = _protocol()
    second = p["secondary"]
    assert second["masking_scope"] == "layer" and second["outcome"] in {"kl", "delta_p"}
    assert max(second["fractions"]) <= 0.2 and second["start_at_layer"]
    assert p["primary"]["outcome"] in {"kl", "delta_p"} and p["primary"]["endpoint"] == "per_term_spearman"
    assert p["data"]["n_documents"] * p["primary"]["positions_per_document"] >= p["primary"]["min_positions"] >= 2000
    assert p["data"]["n_documents"] >= p["primary"]["min_documents"] >= 100
    stats = p["statistics"]
    assert stats["multiple_comparison"] == "holm" and stats["verdicts"] == ["holds", "reversed", "tie", "not testable"]
    assert (
        p["sink_controls"]["rotation_seeds"] >= 20
        and p["sink_controls"]["n_windows"] >= 100
        and p["sink_controls"]["n_documents"] >= 50
    )


def test_the_text_states_what_the_twin_says():
    text = (FOLDER / "PROTOCOL.md").read_text(encoding="utf-8")
    p = _protocol()
    grid = "{" + ", ".join(f"{k:.2f}" for k in p["secondary"]["fractions"]) + "}"
    assert grid in text, grid
    assert f"{p['primary']['positions_per_document']} positions per document" in text
    assert f"B = {p['statistics']['n_boot']}" in text
    assert "Holm" in text and "not testable" in text
    labels = {
        "raw_attention": "raw attention",
        "value_weighted": "value-weighted",
        "contribution": "contribution (signed)",
        "contribution_abs": "|contribution|",
        "value_zeroing": "Value Zeroing",
        "grad_x_act": "gradient × activation",
        "random": "random",
        "output_normalized_intra": "output-normalised",
        "output_normalized_inter": "output-normalised",
    }
    for a, b in p["pairs"]:
        assert any(labels[a] in line and labels[b] in line and "→" in line for line in text.splitlines()), (a, b)
    # every metric the twin names exists in the metric registry or is named by the protocol itself
    from geolens.metrics import metric_names

    registered = set(metric_names())
    planned = {"output_normalized_intra", "output_normalized_inter", "grad_x_act", "contribution_abs"}
    for name in p["primary"]["metrics_source"]:
        assert name in registered or name in planned, name


def test_faithfulness_sign_and_verdict():
    assert (
        faithfulness_sign("comprehensiveness", "delta_ppl") == 1 and faithfulness_sign("sufficiency", "delta_ppl") == -1
    )
    assert (
        faithfulness_sign("comprehensiveness", "delta_logprob") == -1
        and faithfulness_sign("sufficiency", "delta_logprob") == 1
    )
    assert verdict(0.1, 0.2) == "holds" and verdict(-0.2, -0.1) == "reversed"
    assert verdict(0.0, 0.0) == "tie" and verdict(-0.1, 0.1) == "tie" and verdict(0.1, 0.2, False) == "no range"
    assert verdict(0.1, 0.2, True, 1) == "too few documents" and verdict(0.1, 0.2, True, 5) == "holds"
    one = synthetic_result(dict(random=0.3, raw_attention=0.5, contribution=2.0), n=1)
    assert set(one.pairs().verdict) == {"too few documents"}
    assert not claimed_order_holds(one.pairs())["decided"]


def test_layer_groups():
    assert layer_group("early", 30) == tuple(range(10)) and layer_group("late", 30) == tuple(range(20, 30))
    assert layer_group("middle", 4) == (2,) and layer_group("early", 4) == (0, 1)
    with pytest.raises(ValueError, match="unknown layer group"):
        layer_group("top", 30)
