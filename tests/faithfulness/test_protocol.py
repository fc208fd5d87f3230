"""The pre-registered faithfulness protocol (docs/faithfulness/PROTOCOL.md and protocol.json).

The text is frozen: its SHA-256 is recorded in PROTOCOL.sha256, and runs under it record the same
hash. Editing the text makes a new protocol version, deliberately (bump ``version`` in
protocol.json and the hash together). The machine-readable twin must say what the text says.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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
