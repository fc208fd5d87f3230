"""The dose protocol of the sink controls (geolens.sinks.controls_protocol): its doses, and the
registered block read from docs/faithfulness/protocol.json."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from geolens.interventions.sink_values import (
    SinkEditSpec,
)
from geolens.sinks.controls_protocol import DoseProtocol, edit_dose, protocol_deviations, read_protocol
from sinks.conftest import SMALL

PROTOCOL_DIR = Path(__file__).resolve().parents[2] / "docs" / "faithfulness"


def test_doses_of_the_protocol_match_at_one():
    p = DoseProtocol()
    assert [edit_dose(SinkEditSpec("scale", x)) for x in p.lambdas] == [1.0, 0.5, 0.5, 1.0]
    assert [edit_dose(SinkEditSpec("rotate", degrees=a)) for a in p.degrees] == pytest.approx(
        [0.517638090205, 1.0, 1.414213562373, 2.0]
    )
    assert p.matched_lambdas == (0.0, 2.0) and p.matched_degrees == (60.0,)
    assert [len(p.seeds(a)) for a in p.degrees] == [5, 20, 5, 5] and p.seeds(60.0) == tuple(range(20))
    assert len(p.edits()) == 4 + 35 and p.layers(18) == [0, 6, 12]


def test_read_protocol_reads_the_registered_block(tmp_path):
    import hashlib

    protocol, info = read_protocol(PROTOCOL_DIR / "protocol.json")
    assert protocol == DoseProtocol()  # the defaults are the pre-registered settings
    assert DoseProtocol.from_dict(json.loads(json.dumps(SMALL.to_dict()))) == SMALL
    assert info["protocol_sha256"] == hashlib.sha256((PROTOCOL_DIR / "PROTOCOL.md").read_bytes()).hexdigest()
    assert info["pre_registered"] and info["protocol_version"] == 2
    assert protocol_deviations(protocol, protocol, info, model="smollm2-135m", mode="bridge", dtype="float32") == []
    small = replace(protocol, n_documents=5)
    reasons = protocol_deviations(small, protocol, info, model="tiny-gqa", mode="hooked", dtype="float32")
    assert any("n_documents 5 instead of 50" in r for r in reasons) and any("tiny-gqa" in r for r in reasons)
    assert any("hooked" in r for r in reasons) and any("fewer than 100" in r for r in reasons)
    # a copy with an edited text is no longer the pre-registered protocol
    raw = json.loads((PROTOCOL_DIR / "protocol.json").read_text())
    (tmp_path / "PROTOCOL.md").write_text("another text")
    (tmp_path / "REGISTERED.json").write_text((PROTOCOL_DIR / "REGISTERED.json").read_text())
    (tmp_path / "protocol.json").write_text(json.dumps(raw))
    _, copied = read_protocol(tmp_path / "protocol.json")
    assert not copied["pre_registered"]
    bad = {
        "missing.json": None,
        "nojson.json": "{",
        "noblock.json": json.dumps({"version": 2}),
        "nolayers.json": json.dumps(
            {**raw, "sink_controls": {k: v for k, v in raw["sink_controls"].items() if k != "layers"}}
        ),
        "layers.json": json.dumps({**raw, "sink_controls": {**raw["sink_controls"], "layers": "some layers"}}),
        "windows.json": json.dumps({**raw, "sink_controls": {**raw["sink_controls"], "n_windows": 99}}),
        "lambdas.json": json.dumps({**raw, "sink_controls": {**raw["sink_controls"], "lambdas": [0.5, 1.5]}}),
    }
    messages = {
        "missing.json": "no such file",
        "nojson.json": "not valid JSON",
        "noblock.json": 'no "sink_controls" block',
        "nolayers.json": "has no 'layers'",
        "layers.json": "every <ordinal> layer",
        "windows.json": "whole number of windows",
        "lambdas.json": "norm edit and a rotation of dose 1",
    }
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=messages[name]):
            read_protocol(tmp_path / name)
