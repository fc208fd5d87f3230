"""The masking summary (geolens.faithfulness.masking_summary, PROTOCOL.md §4) on constructed rows:
nAOPC, the range and ceiling exclusions, the document bootstrap and the pair tests (one Holm family,
signed by direction) computed by hand, and unpaired rows refused."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from faithfulness.conftest import TWIN
from geolens.faithfulness.layer_masking import (
    ALL_REMOVED,
)
from geolens.faithfulness.masking_summary import masking_summary
from geolens.stats import cluster_bootstrap_indices, holm, percentile_ci, resample_means

FRACTIONS = [0.01, 0.02, 0.05, 0.1, 0.2]


def _summary_protocol() -> dict:
    p = json.loads(TWIN.read_text())
    assert p["secondary"]["fractions"] == FRACTIONS
    return p


def _rows(values, *, all_kl, nll=None, unigram=5.0, hashes=None) -> pd.DataFrame:
    """Rows of every (document, layer) in ``all_kl`` ({(d, l): KL(all removed)}); ``values``
    ((d, l, metric, direction) → KL per k, or a function of those); ``hashes`` (same keys → hash
    per k, default: distinct per metric)."""
    out = []
    for (d, l), kl_all in all_kl.items():
        for metric in METRICS:
            for direction in ("comprehensiveness", "sufficiency"):
                kls = values(d, l, metric, direction)
                for n, k in enumerate(FRACTIONS):
                    h = hashes(d, l, metric, direction, k) if hashes else f"{metric}-{direction}-{d}-{l}-{k}"
                    out.append(
                        dict(
                            document=d,
                            layer=l,
                            metric=metric,
                            direction=direction,
                            k=k,
                            kl=kls[n],
                            delta_p=-kls[n] / 10,
                            nll=(nll or {}).get((d, l, metric), 3.0),
                            unigram_ce=unigram,
                            mask_hash=h,
                        )
                    )
        out.append(
            dict(
                document=d,
                layer=l,
                metric=ALL_REMOVED,
                direction=ALL_REMOVED,
                k=1.0,
                kl=kl_all,
                delta_p=-kl_all / 10,
                nll=(nll or {}).get((d, l, ALL_REMOVED), 3.5),
                unigram_ce=unigram,
                mask_hash=f"all-{d}-{l}",
            )
        )
    return pd.DataFrame(out)


METRICS = [
    "raw_attention",
    "value_weighted",
    "output_normalized_intra",
    "output_normalized_inter",
    "contribution",
    "contribution_abs",
    "value_zeroing",
    "random",
]


def _kls(d, l, metric, direction):
    rng = np.random.default_rng([d, l, METRICS.index(metric), direction == "sufficiency"])
    return (0.05 + rng.random(5) * (1 + METRICS.index(metric) / 4)).tolist()


def test_naopc_range_and_ceiling_exclusions_by_hand():
    all_kl = {(d, l): 2.0 + d + l for d in range(6) for l in (0, 1, 2)}
    all_kl[(1, 2)] = 5e-4  # below the range check's 1e-3 nats
    nll = {(2, 0, "contribution"): 6.0, (3, 1, ALL_REMOVED): 5.5}  # over the unigram CE 5.0: off-distribution
    rows = _rows(_kls, all_kl=all_kl, nll=nll)
    s = masking_summary(rows, _summary_protocol(), n_boot=300, seed=1)
    assert s["range_check"]["n_document_layers_excluded"] == 1 and s["range_check"]["excluded"] == [[1, 2]]
    c = s["ceiling_check"]
    assert (
        c["n_conditions"] == len(rows) and c["n_off_distribution"] == 10 + 1
    )  # 2 directions × 5 k, and one all-removed
    assert c["share"] == pytest.approx(11 / len(rows))
    assert c["n_document_layers_excluded"] == 2 and sorted(c["excluded"]) == [[2, 0], [3, 1]]
    assert c["n_all_removed_off_distribution"] == 1
    assert c["n_conditions_excluded"] == 2 * (len(METRICS) * 10 + 1)
    assert s["n_document_layers"] == 18 and s["n_document_layers_used"] == 15
    excluded = {(1, 2), (2, 0), (3, 1)}
    for m in s["metrics"]:
        per_doc = []
        for d in range(6):
            layers = [l for l in (0, 1, 2) if (d, l) not in excluded]
            per_doc.append(np.mean([np.mean(_kls(d, l, m["metric"], m["direction"])) / all_kl[(d, l)] for l in layers]))
        assert m["naopc"] == pytest.approx(np.mean(per_doc), rel=1e-12)
        assert m["n_documents"] == 6 and m["n_document_layers"] == 15
        assert m["ci_low"] <= m["naopc"] <= m["ci_high"]


def test_without_unigram_the_ceiling_is_not_checked_and_everything_excluded_forms_no_pair():
    all_kl = {(d, 0): 1.0 for d in range(4)}
    rows = _rows(_kls, all_kl=all_kl, unigram=float("nan"), nll={(0, 0, "random"): 99.0})
    s = masking_summary(rows, _summary_protocol(), n_boot=100, seed=0)
    assert s["ceiling_check"]["n_conditions_checked"] == 0 and s["ceiling_check"]["n_off_distribution"] == 0
    assert "not checked" in s["ceiling_check"]["note"]
    empty = masking_summary(_rows(_kls, all_kl={(0, 0): 1e-5}), _summary_protocol(), n_boot=10, seed=0)
    assert empty["pairs"] == [] and empty["metrics"] == [] and empty["n_document_layers_used"] == 0
    assert "no (document, layer) is left" in empty["note"] and empty["range_check"]["n_document_layers_excluded"] >= 1


def test_the_document_bootstrap_resamples_whole_documents():
    """Layers differ within a document, but every document has the same mean: resampling
    documents gives a zero-width interval; the CI is the percentile of per-document means over
    cluster_bootstrap_indices of the documents."""
    all_kl = {(d, l): 1.0 for d in range(8) for l in (0, 1)}

    def values(d, l, metric, direction):
        if metric == "raw_attention":
            return [1.0 + (0.5 if l == 0 else -0.5) * (d + 1)] * 5  # per-document mean 1.0 whatever d
        return _kls(d, l, metric, direction)

    s = masking_summary(_rows(values, all_kl=all_kl), _summary_protocol(), n_boot=500, seed=3)
    raw = next(m for m in s["metrics"] if m["metric"] == "raw_attention" and m["direction"] == "comprehensiveness")
    assert (
        raw["naopc"] == pytest.approx(1.0)
        and raw["ci_low"] == pytest.approx(1.0)
        and raw["ci_high"] == pytest.approx(1.0)
    )
    cont = next(m for m in s["metrics"] if m["metric"] == "contribution" and m["direction"] == "sufficiency")
    per_doc = np.array(
        [np.mean([np.mean(_kls(d, l, "contribution", "sufficiency")) for l in (0, 1)]) for d in range(8)]
    )
    boot = resample_means(per_doc, cluster_bootstrap_indices(np.arange(8), 500, 3))
    lo, hi = percentile_ci(boot, 0.95)
    assert (cont["ci_low"], cont["ci_high"]) == pytest.approx((float(lo), float(hi)), rel=1e-12)


def test_pairs_one_holm_family_signed_by_direction_and_not_testable_when_masks_coincide():
    all_kl = {(d, l): 1.0 for d in range(12) for l in (0, 1)}

    def values(d, l, metric, direction):
        base = 0.2 + 0.01 * ((d * 7 + l * 3) % 5)
        step = {
            "random": 0.0,
            "raw_attention": 0.1,
            "value_weighted": 0.3,
            "output_normalized_intra": 0.3,
            "output_normalized_inter": 0.3,
            "contribution": 0.6,
            "contribution_abs": 0.5,
            "value_zeroing": 0.5,
        }[metric]
        return [base + step] * 5  # larger for better metrics: holds under comprehensiveness, reversed under sufficiency

    def hashes(d, l, metric, direction, k):
        if metric in ("value_weighted", "output_normalized_intra") and direction == "comprehensiveness":
            return f"shared-{d}-{l}-{k}"  # the pair's masks coincide in this direction only
        return f"{metric}-{direction}-{d}-{l}-{k}"

    protocol = _summary_protocol()
    s = masking_summary(_rows(values, all_kl=all_kl, hashes=hashes), protocol, n_boot=400, seed=0)
    pairs = s["pairs"]
    formed = [tuple(p) for p in protocol["pairs"] if "grad_x_act" not in p]
    assert [(p["a"], p["b"]) for p in pairs] == formed * 2
    assert [p["direction"] for p in pairs] == ["comprehensiveness"] * len(formed) + ["sufficiency"] * len(formed)
    keys = (
        "a",
        "b",
        "direction",
        "estimate",
        "ci_low",
        "ci_high",
        "level",
        "p",
        "p_adj",
        "rank",
        "verdict",
        "holm_stopped_at",
        "rules_differ",
    )
    for p in pairs:
        assert all(k in p for k in keys)
    vw = [p for p in pairs if (p["a"], p["b"]) == ("value_weighted", "output_normalized_intra")]
    assert vw[0]["verdict"] == "not testable" and vw[0]["p_adj"] is None and vw[0]["rank"] == 0
    assert vw[1]["verdict"] == "tie"  # equal values but different masks: measured, undecided
    testable = [p for p in pairs if p["verdict"] != "not testable"]
    assert len(testable) == 2 * len(formed) - 1
    assert [p["p_adj"] for p in testable] == pytest.approx(holm([p["p"] for p in testable]).tolist())
    for p in testable:
        assert p["ci_low"] <= p["estimate"] <= p["ci_high"]
        if p["verdict"] == "holds":
            assert p["ci_low"] > 0
        elif p["verdict"] == "reversed":
            assert p["ci_high"] < 0
    by = {(p["a"], p["b"], p["direction"]): p for p in pairs}
    # Δ > 0 means b better in both directions: larger nAOPC is better only under comprehensiveness
    assert by[("raw_attention", "contribution", "comprehensiveness")]["estimate"] == pytest.approx(0.5)
    assert by[("raw_attention", "contribution", "comprehensiveness")]["verdict"] == "holds"
    assert by[("raw_attention", "contribution", "sufficiency")]["estimate"] == pytest.approx(-0.5)
    assert by[("raw_attention", "contribution", "sufficiency")]["verdict"] == "reversed"
    assert by[("output_normalized_inter", "contribution", "comprehensiveness")]["estimate"] == pytest.approx(0.3)
    assert s["multiple_comparison"] == "holm" and s["pairs_not_formed"] == []
    # exploratory parts exist, outside the family
    assert s["exploratory"]["delta_p"]["pairs"] and s["exploratory"]["per_k"]["pairs"]
    assert {e["layer"] for e in s["exploratory"]["per_layer"]} == {0, 1}
    json.dumps(s)  # a summary.json can hold it


def test_a_pair_whose_metric_was_not_run_is_not_formed():
    rows = _rows(_kls, all_kl={(d, 0): 1.0 for d in range(5)})
    rows = rows[rows.metric != "value_zeroing"]
    s = masking_summary(rows, _summary_protocol(), n_boot=50, seed=0)
    assert [(p["a"], p["b"]) for p in s["pairs_not_formed"]] == [("contribution_abs", "value_zeroing")]
    assert all("value_zeroing" not in (p["a"], p["b"]) for p in s["pairs"])


def test_unpaired_rows_are_refused():
    rows = _rows(_kls, all_kl={(d, 0): 1.0 for d in range(4)})
    drop = (rows.document == 2) & (rows.metric == "random") & (rows.direction == "sufficiency")
    with pytest.raises(ValueError, match="paired"):
        masking_summary(rows[~drop], _summary_protocol(), n_boot=10, seed=0)
    with pytest.raises(ValueError, match="fractions"):
        masking_summary(rows[~(drop & (rows.k == 0.05))], _summary_protocol(), n_boot=10, seed=0)
    with pytest.raises(ValueError, match="all-removed"):
        masking_summary(rows[rows.metric != ALL_REMOVED], _summary_protocol(), n_boot=10, seed=0)
