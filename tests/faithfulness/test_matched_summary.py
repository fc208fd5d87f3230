"""Protocol 4's masking summary and the addendum's corrected family (geolens.faithfulness.matched_summary).

The excess, its interval and the family of 10 tests against a computation by hand on constructed
rows (AOPC as the mean over k, the control as the mean over draws, the bootstrap of
geolens.stats.bootstrap_indices); the corrected family against the published summary of the
addendum: 15 tests, the same Δ and verdicts as published for every test kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geolens.faithfulness.matched_masking import CHECKED, MATCHED
from geolens.faithfulness.matched_summary import corrected_addendum_family, matched_masking_summary, render_readme
from geolens.stats import bootstrap_indices, resample_means

DOCS = Path(__file__).resolve().parents[2] / "docs"
TWIN = json.loads((DOCS / "faithfulness/v4/protocol.json").read_text(encoding="utf-8"))
METRICS = TWIN["matched_masking"]["metrics"]
FRACTIONS = TWIN["matched_masking"]["fractions"]


def _constructed(n_docs=12, seed=0):
    rng = np.random.default_rng(seed)
    stored, rows = [], []
    for d in range(n_docs):
        for mi, m in enumerate(METRICS + ["output_normalized_inter"]):
            for k in FRACTIONS:
                stored.append(
                    dict(
                        document=d,
                        layer=d % 3,
                        metric=m,
                        direction="comprehensiveness",
                        k=k,
                        kl=0.1 * mi + k + rng.normal(0, 0.01),
                        mask_hash=f"{d}/{'value_weighted' if m == 'output_normalized_inter' else m}/{k}",
                    )
                )
                stored.append(dict(document=d, layer=d % 3, metric=m, direction="sufficiency", k=k, kl=9.0))
        stored.append(dict(document=d, layer=d % 3, metric="all_removed", direction="all_removed", k=1.0, kl=0.3))
        for m in METRICS:
            for k in FRACTIONS:
                for draw in range(3):
                    rows.append(
                        dict(
                            document=d,
                            layer=d % 3,
                            metric=MATCHED,
                            target=m,
                            k=k,
                            draw=draw,
                            kl=k + rng.normal(0, 0.01),
                            n_removed=50,
                            n_removed_target=5,
                            norm_ratio_median=1.0,
                            n_unmatched=draw,
                            stored_kl=np.nan,
                        )
                    )
        rows.append(
            dict(
                document=d,
                layer=d % 3,
                metric=CHECKED,
                target="all_removed",
                k=1.0,
                draw=-1,
                kl=0.3,
                n_removed=60,
                n_removed_target=60,
                norm_ratio_median=1.0,
                n_unmatched=0,
                stored_kl=0.3,
            )
        )
    return pd.DataFrame(rows), pd.DataFrame(stored)


def test_excess_and_family_equal_a_computation_by_hand():
    rows, stored = _constructed()
    out = matched_masking_summary(rows, stored, TWIN)
    docs = sorted(set(rows.document))
    comp = stored[stored.direction == "comprehensiveness"]
    own = {m: np.array([comp[(comp.document == d) & (comp.metric == m)].kl.mean() for d in docs]) for m in METRICS}
    ctrl = {
        m: np.array(
            [rows[(rows.document == d) & (rows.target == m) & (rows.metric == MATCHED)].kl.mean() for d in docs]
        )
        for m in METRICS
    }
    excess = {m: own[m] - ctrl[m] for m in METRICS}
    idx = bootstrap_indices(len(docs), TWIN["statistics"]["n_boot"], TWIN["statistics"]["seed"])
    for entry in out["metrics"]:
        m = entry["metric"]
        assert entry["excess"]["mean"] == pytest.approx(excess[m].mean(), abs=1e-12)
        lo, hi = np.percentile(resample_means(excess[m], idx), [2.5, 97.5])
        assert (entry["excess"]["ci_low"], entry["excess"]["ci_high"]) == pytest.approx((lo, hi), abs=1e-12)
    tests = out["tests"]
    assert len(tests) == 10 and [t["kind"] for t in tests].count("excess") == 5
    pair = next(t for t in tests if t["a"] == "output_normalized_inter")  # its masks are value-weighted's
    assert pair["estimate"] == pytest.approx((excess["contribution"] - excess["value_weighted"]).mean(), abs=1e-12)
    assert out["above_all_removed"]["n_documents"] == 12
    assert out["reuse_checks"]["n"] == 12 and out["reuse_checks"]["max_relative_difference"] == 0.0
    share = out["matching"][0]
    assert share["n_conditions"] == 36 and share["n_queries"] == 128
    assert share["unmatched_share"] == pytest.approx((0 + 1 + 2) * 12 / (36 * 128))  # n_unmatched = draw
    assert "| excess of contribution |" in render_readme(
        dict(out, part="matched-masking", model="m", label="x", command="c")
    )


def test_a_document_without_its_controls_or_with_unequal_masks_is_refused():
    rows, stored = _constructed()
    with pytest.raises(ValueError, match="lacks"):
        matched_masking_summary(rows[~((rows.document == 3) & (rows.target == "contribution"))], stored, TWIN)
    with pytest.raises(ValueError, match="needs 3 control draws"):
        matched_masking_summary(rows[~((rows.document == 3) & (rows.draw == 2))], stored, TWIN)
    other = stored.copy()
    other.loc[other.metric == "output_normalized_inter", "mask_hash"] = "x"
    with pytest.raises(ValueError, match="not value_weighted's"):
        matched_masking_summary(rows, other, TWIN)


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_the_corrected_addendum_family_drops_only_the_duplicate(model):
    folder = DOCS / "faithfulness/v3/masking" / model
    rows = pd.read_csv(folder / "masking_rows.csv.gz")
    published = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    out = corrected_addendum_family(rows, published, TWIN)
    assert out["n_tests_published"] == 16 and out["n_tests"] == 15
    kept = {(p["a"], p["b"], p["direction"]): p for p in out["corrected_tests"]}
    assert ("contribution_negated", "contribution", "sufficiency") not in kept
    for p in published["masking"]["pairs"]:
        key = (p["a"], p["b"], p["direction"])
        if key in kept:
            assert kept[key]["estimate"] == pytest.approx(p["estimate"], abs=1e-15)  # the same Δ: one bootstrap
    # the dropped test is the comprehensiveness test again: the same per-document differences
    comp = next(
        p
        for p in published["masking"]["pairs"]
        if p["a"] == "contribution_negated" and p["b"] == "contribution" and p["direction"] == "comprehensiveness"
    )
    suff = next(
        p
        for p in published["masking"]["pairs"]
        if p["a"] == "contribution_negated" and p["b"] == "contribution" and p["direction"] == "sufficiency"
    )
    assert comp["estimate"] == pytest.approx(suff["estimate"], abs=1e-15)
