"""Leave-one-out stability of published verdicts (geolens.stability, docs/stability/PROTOCOL.md).

The tally against a family built here whose verdict flips when one named document or layer is
left out (counted by hand), the fragile threshold at 95 %, and, in the slow tier, every published
family recomputed from its stored rows with nothing left out giving its published verdicts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from geolens.stability import FRAGILE_BELOW, assess, label_of
from geolens.stability.families import Family, key_of, published_families
from geolens.stability.report import render
from geolens.stats import holm_family

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _family(values: np.ndarray, layers: np.ndarray, rule=None) -> Family:
    """One test a → b on documents with ``values``: by default decided by a bootstrap interval of
    their mean (geolens.stats.holm_family); ``rule(kept values) -> verdict`` decides it instead."""

    def recompute(document, layer):
        keep = np.ones(len(values), dtype=bool)
        if document is not None:
            keep &= np.arange(len(values)) != document
        if layer is not None:
            keep &= layers != layer
        v = values[keep]
        if rule is not None:
            return [dict(a="x", b="y", verdict=rule(v))]
        samples = v[np.random.default_rng(0).integers(0, len(v), size=(2000, len(v)))].mean(1)
        (result,) = holm_family([v.mean()], [samples])
        return [dict(a="x", b="y", verdict=result.verdict)]

    published = recompute(None, None)
    return Family("constructed", "m", Path("."), published, list(range(len(values))), sorted(set(layers)), recompute)


def test_a_verdict_carried_by_one_document_is_fragile_and_its_flips_are_counted():
    values = np.zeros(40)
    values[7] = 2.0  # document 7 (layer 3) carries the verdict
    layers = np.arange(40) % 4
    result = assess(_family(values, layers, rule=lambda v: "holds" if v.sum() > 1 else "tie"), progress=lambda *_: None)
    (test,) = result["tests"]
    assert result["reproduces"] and test["verdict"] == "holds"
    assert test["documents"] == dict(n=40, kept=39, share=39 / 40, flips={"tie": 1})
    assert test["layers"] == dict(n=4, kept=3, share=0.75, flips={"tie": 1})
    assert test["label"] == "fragile" and result["n_fragile"] == 1 and result["n_tests"] == 1


def test_a_verdict_every_leave_out_keeps_is_stable():
    values = np.random.default_rng(1).normal(1.0, 0.1, 40)
    result = assess(_family(values, np.arange(40) % 5), progress=lambda *_: None)
    assert result["tests"][0]["label"] == "stable" and result["tests"][0]["documents"]["share"] == 1.0
    combined, text = render([result])
    assert combined["n_fragile"] == 0 and "| x → y | holds | 40/40 | 5/5 | stable |" in text


def test_the_threshold_and_the_keys():
    import json

    plan = json.loads((DOCS / "stability" / "protocol.json").read_text(encoding="utf-8"))
    assert FRAGILE_BELOW == plan["fragile_below"] == 0.95  # the registered threshold
    assert label_of({"share": 0.95}, {"share": 1.0}) == "stable"
    assert label_of({"share": 0.949}, None) == "fragile"
    assert key_of({"family": "primary", "direction": "sufficiency", "a": "random", "b": "alti"}) == (
        "primary / sufficiency: random → alti"
    )


@pytest.mark.slow
def test_every_published_family_recomputes_to_its_published_verdicts():
    families = published_families(DOCS)
    names = {f.name for f in families}
    assert {"protocol 3 per-term", "flow v3", "sink controls", "protocol 3 addendum multiple choice"} <= names
    for family in families:
        got = {key_of(t): t["verdict"] for t in family.compute()}
        want = {key_of(t): t["verdict"] for t in family.published}
        assert got == want, f"{family.name}, {family.model}"


def test_annotate_adds_the_labels_and_keeps_the_manifest_true(tmp_path):
    import hashlib
    import json

    from geolens.run_folder import manifest_problems
    from geolens.stability.__main__ import annotate

    folder = tmp_path / "docs" / "flow" / "m"
    folder.mkdir(parents=True)
    data = json.dumps({"pairs": [{"a": "x", "b": "y", "verdict": "holds", "delta": 0.25}]}).encode()
    (folder / "summary.json").write_bytes(data)
    files = {"summary.json": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    (folder / "manifest.json").write_text(json.dumps({"command": "c", "files": files}))
    test = dict(test="x → y", verdict="holds", label="fragile", documents=dict(share=0.5), layers=None)
    combined = dict(
        fragile_below=0.95, families=[dict(family="flow v1", model="m", folder="docs/flow/m", tests=[test])]
    )
    annotate(combined, tmp_path)
    out = json.loads((folder / "summary.json").read_text())
    assert out["pairs"][0]["delta"] == 0.25  # the published numbers as they were
    assert out["stability"]["flow v1"]["tests"] == [
        dict(test="x → y", verdict="holds", documents_kept=0.5, layers_kept=None, label="fragile")
    ]
    assert manifest_problems(folder) == []
    (folder / "summary.json").write_text("{}")  # not the file the manifest lists: refused
    with pytest.raises(SystemExit, match="not the file its manifest lists"):
        annotate(combined, tmp_path)
